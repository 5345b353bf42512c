// Package nats holds the values kvindex's NATS mode gives the official
// NATS Helm chart (values.yaml; ../README.md, "NATS mode", explains them)
// and the test that checks them offline, where Helm cannot fetch the
// chart: the file decodes strictly into the subset of the chart's 1.x
// values layout it uses (a misspelt or misplaced key, or one of the 0.x
// chart's names, fails), JetStream runs on a file store large enough for
// the stream and the snapshots the kvindex replicas are configured to
// keep, the cluster has the servers the stream's replicas need, the
// image is pinned, and the pods meet Pod Security "restricted". The
// package has no Go API.
package nats
