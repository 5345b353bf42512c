// Package kubernetes holds kvindex's Kubernetes manifests (kustomize
// directories, not Go) and the test that checks them offline, without a
// cluster: it builds every kustomization with the kustomize Go API,
// decodes the output strictly into the upstream k8s.io/api types, and
// asserts what a reviewer would otherwise have to re-check by hand on
// every change:
//
//   - every pod template passes Pod Security "restricted", evaluated by
//     the Kubernetes admission controller's own checks
//     (k8s.io/pod-security-admission), plus a read-only root filesystem
//     and no service-account token;
//   - every image is pinned to a version (no :latest, no bare name);
//   - kvindex's container ports are the ports its ConfigMap tells
//     `kvindex serve` to listen on, and its pod runs as the Dockerfile's
//     user;
//   - the NetworkPolicies admit exactly engines to the event ports and
//     clients to the query ports, and let kvindex reach only the
//     engines' replay and /tokenize ports and DNS (in NATS mode: no
//     event port, and NATS's client port out);
//   - Services, disruption budgets and the Prometheus Operator's monitors
//     select pods (or Services) that exist, on ports they have; probes
//     use their container's ports; spread constraints select their own
//     pods;
//   - the NATS-mode replicas roll out one caught-up replica at a time,
//     tell ready (/readyz) from alive (/healthz), allow a snapshot
//     restore to start, and have a disruption budget and a spread;
//   - each relay sidecar dials, over loopback, the ports its engine binds
//     for every data-parallel rank, for the same model and pod name.
//
// The package has no non-test code; its imports are test-only.
package kubernetes
