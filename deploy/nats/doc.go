// Package nats holds the values kvindex's NATS mode gives the official
// NATS Helm chart (values.yaml; ../README.md, "NATS mode", explains them),
// the NetworkPolicy in front of the servers (networkpolicy.yaml), and the
// tests that check them offline, where Helm cannot fetch the chart: the
// file decodes strictly into the subset of the chart's 1.x values layout
// it uses (a misspelt or misplaced key, or one of the 0.x chart's names,
// fails), JetStream runs on a file store large enough for the stream and
// the snapshots the kvindex replicas are configured to keep, the cluster
// has the servers the stream's replicas need, the image is pinned, the
// pods meet Pod Security "restricted", every client authenticates as the
// relay or the replica user with no more permissions than its role needs
// and a password from the Secret its kvindex container reads, and only
// kvindex's pods reach the client port.
//
// Its Go API serves the tests that run a real server on this
// configuration (internal/service): Values is values.yaml, ServerConfig
// renders it as the chart does, Users reads its authorization users.
package nats
