// Package enginemetrics scrapes the inference engines' own Prometheus
// metrics for the gateway picker and computes the live fleet
// cached-prefix fraction, the number kvindex exists to move. Unlike
// package picker, which is pure, it does I/O: HTTP scrapes on an
// interval, from goroutines it owns.
package enginemetrics
