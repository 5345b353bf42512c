// Package kubetest holds what tests need to drive engine discovery
// through client-go's fake clientset: its typed pods as a
// kubediscovery.PodClient, and engine pods. Only tests import it (kvindex
// itself reads pods through the dynamic client, without the typed
// clientset's API groups).
package kubetest

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/kvindex/kvindex/internal/kubediscovery"
)

// TypedPods is a typed clientset's pods (a fake one's, in tests) as a
// kubediscovery.PodClient.
func TypedPods(c corev1client.CoreV1Interface) kubediscovery.PodClient { return typedPods{c} }

type typedPods struct{ c corev1client.CoreV1Interface }

func (t typedPods) Pods(ns string) kubediscovery.PodInterface { return t.c.Pods(ns) }

// EnginePod is a Ready, Running pod named name at ip, in namespace "llm"
// with the label app=vllm.
func EnginePod(name, ip string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: map[string]string{"app": "vllm"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}
