// Package kubediscovery finds vLLM engines on Kubernetes: the pods of one
// namespace that match a label selector, as the Gateway API Inference
// Extension's InferencePool selects its endpoints. A Watcher follows them
// with a client-go shared informer (a list, then a watch, restricted to
// the namespace and the selector on the API server) and reports the whole
// set of engines each time it changes, so a consumer compares the set
// with what it runs rather than replaying add and delete events: a missed
// or repeated report cannot leave it wrong.
//
// A pod is an engine once it is Running and has an IP. Readiness is not
// required: vLLM binds its KV-event publisher while it starts, before its
// readiness probe passes, and the events it sends then (a warm-up's blocks)
// are cache the index should know; Engine.Ready says whether the pod is
// Ready, for consumers that route requests (the endpoint picker) and must
// not pick a pod that is not.
//
// A pod that goes away (deleted, terminating, failed, no longer matching
// the selector, or no longer Running) stays an engine for Config.Grace, so
// a short watch gap or a rolling restart's overlap does not throw away
// its cache, and is dropped after it. The pod IP is the engine's identity
// (where its events come from), so a pod whose IP changes is replaced at
// once: the old address is another engine now, or nothing.
//
// Clients come from the pod's service account (in-cluster) or a kubeconfig
// (KUBECONFIG or ~/.kube/config): see NewClient. Tests use client-go's
// fake clientset and a fake clock (k8s.io/utils/clock/testing).
package kubediscovery
