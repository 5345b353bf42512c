package kubediscovery

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
)

// PodClient lists and watches the pods of a namespace. A typed clientset's
// CoreV1() has the methods, so tests pass a fake clientset's; the binary
// uses DynamicPods. The typed clients are not used outside tests because
// they register every API group of Kubernetes in one scheme when the
// program starts: linked into kvindex they more than doubled the binary
// (35 to 99 MB) and its resident memory at start (32 to 72 MB), for one
// informer over pods.
type PodClient interface {
	Pods(namespace string) PodInterface
}

// PodInterface is the part of client-go's typed PodInterface an informer
// needs.
type PodInterface interface {
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

var podsResource = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// DynamicPods reads pods through client-go's dynamic client, converting
// what it returns into core/v1 Pods.
func DynamicPods(c dynamic.Interface) PodClient { return dynamicPods{c} }

type dynamicPods struct{ c dynamic.Interface }

func (d dynamicPods) Pods(namespace string) PodInterface {
	return dynamicPodInterface{d.c.Resource(podsResource).Namespace(namespace)}
}

type dynamicPodInterface struct{ r dynamic.ResourceInterface }

func (d dynamicPodInterface) List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	ul, err := d.r.List(ctx, opts)
	if err != nil {
		return nil, err
	}
	out := &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: ul.GetResourceVersion(), Continue: ul.GetContinue()}}
	out.Items = make([]corev1.Pod, len(ul.Items))
	for i := range ul.Items {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(ul.Items[i].Object, &out.Items[i]); err != nil {
			return nil, fmt.Errorf("kubediscovery: pod %s: %w", ul.Items[i].GetName(), err)
		}
	}
	return out, nil
}

func (d dynamicPodInterface) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := d.r.Watch(ctx, opts)
	if err != nil {
		return nil, err
	}
	return watch.Filter(w, convertEvent), nil
}

// convertEvent turns a watch event's unstructured object into a Pod (or,
// for an error event, the Status it carries); one that does not convert
// becomes an error event, which makes the informer list again.
func convertEvent(e watch.Event) (watch.Event, bool) {
	u, ok := e.Object.(*unstructured.Unstructured)
	if !ok {
		return e, true
	}
	var target runtime.Object = &corev1.Pod{}
	if e.Type == watch.Error {
		target = &metav1.Status{}
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, target); err != nil {
		return watch.Event{Type: watch.Error, Object: &metav1.Status{
			Status: metav1.StatusFailure, Message: "kubediscovery: watch event: " + err.Error(),
		}}, true
	}
	e.Object = target
	return e, true
}
