package kubediscovery

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

// unstructuredPod is p as the dynamic client carries it.
func unstructuredPod(t *testing.T, p *corev1.Pod) *unstructured.Unstructured {
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

// The binary's client, DynamicPods, reads pods through client-go's
// dynamic client: a watcher over it (a dynamic fake here) follows a pod
// that appears and drops one that goes away, as over a typed clientset.
func TestDynamicPods(t *testing.T) {
	dc := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{podsResource: "PodList"})
	sets := make(chan []Engine, 16)
	w, err := New(DynamicPods(dc), Config{Namespace: ns, Selector: selector, ModelLabel: "model", Grace: -1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, func(s []Engine) { sets <- s })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	await := func(want []Engine) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case got := <-sets:
				if len(got) == len(want) && (len(got) == 0 || got[0] == want[0]) {
					return
				}
			case <-deadline:
				t.Fatalf("the watcher never reported %v", want)
			}
		}
	}
	await(nil)
	pods := dc.Resource(podsResource).Namespace(ns)
	if _, err := pods.Create(ctx, unstructuredPod(t, pod("vllm-0", "10.0.0.7", true)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	await([]Engine{engine("vllm-0", "10.0.0.7", true)})
	if err := pods.Delete(ctx, "vllm-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	await(nil)
}

// A watch event that is not a pod becomes an error event (the informer
// lists again) rather than a pod with zero fields.
func TestConvertEvent(t *testing.T) {
	good, _ := convertEvent(watch.Event{Type: watch.Added, Object: unstructuredPod(t, pod("a", "10.0.0.1", true))})
	if p, ok := good.Object.(*corev1.Pod); !ok || p.Status.PodIP != "10.0.0.1" || good.Type != watch.Added {
		t.Errorf("pod event: %#v", good)
	}
	bad, _ := convertEvent(watch.Event{Type: watch.Modified, Object: &unstructured.Unstructured{Object: map[string]any{"spec": "not a map"}}})
	if _, ok := bad.Object.(*metav1.Status); !ok || bad.Type != watch.Error {
		t.Errorf("malformed event: %#v", bad)
	}
	st, _ := convertEvent(watch.Event{Type: watch.Error, Object: &unstructured.Unstructured{Object: map[string]any{"kind": "Status", "message": "gone", "code": int64(410)}}})
	if s, ok := st.Object.(*metav1.Status); !ok || s.Code != 410 || s.Message != "gone" {
		t.Errorf("error event: %#v", st)
	}
}
