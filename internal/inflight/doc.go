// Package inflight bounds what concurrent requests hold at once: a Gate
// is a weighted semaphore that never waits. A request that would take the
// total past the bound is refused at once, so that a burst of large
// requests is turned away while small ones still pass, and no caller
// queues behind another; a gate's reserve keeps room for small requests
// once large ones fill its bound. The server gates query tokens and HTTP request
// body bytes with it, the picker the request bodies it buffers.
package inflight
