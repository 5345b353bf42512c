package wire

// Transport sizes of both sides: HTTP/2 flow-control windows and socket
// buffers sized for many concurrent 50 KiB queries (a query of 16,384
// token ids is ~48 KiB; with many in flight gRPC's default 64 KiB
// windows stall senders on WINDOW_UPDATEs).
const (
	WindowSize     = 1 << 20
	ConnWindowSize = 1 << 24
	IOBufferSize   = 1 << 18
)
