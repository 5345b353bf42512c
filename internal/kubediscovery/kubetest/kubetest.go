// Package kubetest holds what tests need to drive engine discovery: a
// fake cluster whose pods kvindex reads through its own client
// (kubediscovery.DynamicPods over client-go's dynamic fake), and engine
// pods. Only tests import it.
package kubetest

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/kvindex/kvindex/internal/kubediscovery"
)

var podsResource = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// Cluster is a fake API server's pods.
type Cluster struct {
	dc *dynamicfake.FakeDynamicClient
}

// NewCluster returns a cluster holding pods.
func NewCluster(t testing.TB, pods ...*corev1.Pod) *Cluster {
	t.Helper()
	objs := make([]runtime.Object, len(pods))
	for i, p := range pods {
		objs[i] = Unstructured(t, p)
	}
	return &Cluster{dc: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{podsResource: "PodList"}, objs...)}
}

// Client is the cluster as kvindex reads it (kubediscovery.DynamicPods).
func (c *Cluster) Client() kubediscovery.PodClient { return kubediscovery.DynamicPods(c.dc) }

// Create adds pod.
func (c *Cluster) Create(t testing.TB, pod *corev1.Pod) {
	t.Helper()
	if _, err := c.pods(pod.Namespace).Create(context.Background(), Unstructured(t, pod), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// Update replaces pod.
func (c *Cluster) Update(t testing.TB, pod *corev1.Pod) {
	t.Helper()
	if _, err := c.pods(pod.Namespace).Update(context.Background(), Unstructured(t, pod), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// Delete removes the pod named name from namespace ns.
func (c *Cluster) Delete(t testing.TB, ns, name string) {
	t.Helper()
	if err := c.pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (c *Cluster) pods(ns string) dynamic.ResourceInterface {
	return c.dc.Resource(podsResource).Namespace(ns)
}

// Unstructured is p as the dynamic client carries it.
func Unstructured(t testing.TB, p *corev1.Pod) *unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion("v1")
	u.SetKind("Pod")
	return u
}

// EnginePod is a Ready, Running pod named name at ip, in namespace "llm"
// with the label app=vllm.
func EnginePod(name, ip string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: map[string]string{"app": "vllm"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}
