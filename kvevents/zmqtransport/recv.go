package zmqtransport

/*
#cgo !windows pkg-config: libzmq
#include <zmq.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define KV_MAXF 8

// kv_rx holds the frames of one received message until they are copied
// out: a message larger than the caller's buffer waits here while Go
// grows the buffer.
// The peer fields hold the first frame's "Peer-Address" property when
// want_peer is set (the listener checks sources): libzmq's metadata lives
// as long as the message, so it is copied out before the message is
// released.
#define KV_PEERMAX 64
typedef struct {
	zmq_msg_t parts[KV_MAXF];
	int held;
	int want_peer;
	size_t peerlen;
	char peer[KV_PEERMAX];
} kv_rx;

static int kv_sock_type(void *s) {
	int t = -1;
	size_t l = sizeof t;
	if (zmq_getsockopt(s, ZMQ_TYPE, &t, &l) != 0) {
		return -1;
	}
	return t;
}

// kv_readable reports whether s has a message to read (ZMQ_EVENTS).
static int kv_readable(void *s) {
	int ev = 0;
	size_t l = sizeof ev;
	if (zmq_getsockopt(s, ZMQ_EVENTS, &ev, &l) != 0) {
		return 0;
	}
	return (ev & ZMQ_POLLIN) != 0;
}

static void kv_release(kv_rx *rx) {
	for (int i = 0; i < rx->held; i++) {
		zmq_msg_close(&rx->parts[i]);
	}
	rx->held = 0;
}

// kv_copy copies the held frames, back to back, into buf and releases them.
static void kv_copy(kv_rx *rx, char *buf) {
	size_t off = 0;
	for (int i = 0; i < rx->held; i++) {
		size_t l = zmq_msg_size(&rx->parts[i]);
		if (l > 0) {
			memcpy(buf + off, zmq_msg_data(&rx->parts[i]), l);
		}
		off += l;
	}
	kv_release(rx);
}

// kv_recv receives one multipart message without blocking. The sizes of
// its first KV_MAXF frames go to lens and their sum to *total; further
// frames are dropped. *fd is the file descriptor of the connection it came
// on (ZMQ_SRCFD), -1 if unknown. If total <= cap the frames are copied into buf and
// released; otherwise they stay in rx for kv_copy. It returns the number
// of frames, or -1 with errno set (EAGAIN: no message).
static int kv_recv(void *s, kv_rx *rx, char *buf, size_t cap, size_t *lens, size_t *total, int *fd) {
	int n = 0, more = 1;
	size_t sum = 0;
	kv_release(rx);
	while (more) {
		zmq_msg_t spill;
		zmq_msg_t *m = n < KV_MAXF ? &rx->parts[n] : &spill;
		zmq_msg_init(m);
		int rc;
		do {
			rc = zmq_msg_recv(m, s, ZMQ_DONTWAIT);
		} while (rc < 0 && errno == EINTR);
		if (rc < 0) {
			int e = errno;
			zmq_msg_close(m);
			kv_release(rx);
			errno = e;
			return -1;
		}
		more = zmq_msg_more(m);
		if (n == 0) {
			*fd = zmq_msg_get(m, ZMQ_SRCFD);
			if (rx->want_peer) {
				const char *p = zmq_msg_gets(m, "Peer-Address");
				size_t l = p == NULL ? 0 : strlen(p);
				if (l > KV_PEERMAX) {
					l = 0; // no address is this long: unknown
				}
				if (l > 0) {
					memcpy(rx->peer, p, l);
				}
				rx->peerlen = l;
			}
		}
		if (n < KV_MAXF) {
			lens[n] = zmq_msg_size(m);
			sum += lens[n];
			rx->held = n + 1;
		} else {
			zmq_msg_close(m);
		}
		n++;
	}
	*total = sum;
	if (sum <= cap) {
		kv_copy(rx, buf);
	}
	return n;
}
*/
import "C"

import (
	"sync/atomic"
	"unsafe"

	zmq "github.com/pebbe/zmq4"
)

// Receiving through pebbe/zmq4 costs five cgo calls and one allocation per
// frame, plus a cgo call for ZMQ_RCVMORE: about 18 calls per 3-frame
// message, which BenchmarkReceive showed to be ~40% of the subscriber's
// CPU. receiver reads a whole message in one cgo call into a reused
// buffer instead. pebbe still creates, configures and closes the sockets.

// maxFrames is the most frames a message keeps; the rest are read and
// dropped (the message is malformed anyway).
const maxFrames = C.KV_MAXF

const (
	rxInitial = 4 << 10 // a typical batch is 1 to 3 KiB
	rxKeep    = 1 << 20 // larger buffers are not kept between messages
)

// receiver reads messages from the sockets of one stream or listener.
// The frames it returns alias its buffer and are valid until the next
// receive. A message larger than rxKeep gets a buffer of its own, which
// the next receive call lets go of (the I/O loops call recv until it
// reports EAGAIN, so that is right after the message was handled, not when
// the next message arrives), and its arrival hands free malloc memory
// back (trimMalloc), as libzmq's copy of it was just freed.
type receiver struct {
	rx     *C.kv_rx
	buf    []byte
	lens   [maxFrames]C.size_t
	total  C.size_t // a field, not a local: its address goes to C, which would move a local to the heap
	fd     C.int    // the last message's connection (ZMQ_SRCFD); -1 if unknown
	frames [][]byte
	// peer is the last message's source address (libzmq's Peer-Address
	// property), read only after wantPeer: fallback path only (the fast
	// path keeps it in rx).
	peer  []byte
	large bool // frames alias a message larger than rxKeep
}

func newReceiver() *receiver {
	return &receiver{
		rx:     (*C.kv_rx)(C.calloc(1, C.sizeof_kv_rx)),
		buf:    make([]byte, rxInitial),
		frames: make([][]byte, 0, maxFrames),
	}
}

// wantPeer makes recv read each message's source address (Peer-Address),
// which peerAddr returns. It costs a lookup in the message's metadata
// (BenchmarkReceive's PeerAddress case measures it).
func (r *receiver) wantPeer() { r.rx.want_peer = 1 }

// peerAddr returns the last message's source address as libzmq wrote it
// (e.g. "10.0.0.5"), empty if unknown or not asked for (wantPeer). It
// aliases the receiver's memory until the next recv.
func (r *receiver) peerAddr() []byte {
	if r.peer != nil {
		return r.peer
	}
	n := int(r.rx.peerlen)
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&r.rx.peer[0])), n)
}

// free releases the C state. Idempotent.
func (r *receiver) free() {
	r.drop()
	if r.rx != nil {
		C.kv_release(r.rx)
		C.free(unsafe.Pointer(r.rx))
		r.rx = nil
	}
}

// recv reads one message without blocking and returns its frames (at most
// maxFrames) and its frame count.
func (r *receiver) recv(sock *zmq.Socket) ([][]byte, int, error) {
	r.drop()
	raw := rawSocket(sock)
	if raw == nil {
		r.fd = -1
		r.peer = nil
		var frames [][]byte
		var n int
		var err error
		if r.rx.want_peer != 0 {
			frames, n, r.peer, err = recvMessagePeer(sock, r.frames)
		} else {
			frames, n, err = recvMessage(sock, r.frames)
		}
		size := 0
		for _, f := range frames {
			size += len(f)
		}
		r.large = size > rxKeep
		return frames, n, err
	}
	r.rx.peerlen = 0
	n, err := C.kv_recv(raw, r.rx, (*C.char)(unsafe.Pointer(&r.buf[0])), C.size_t(len(r.buf)), &r.lens[0], &r.total, &r.fd)
	if n < 0 {
		return r.frames[:0], 0, zmq.AsErrno(err)
	}
	buf := r.buf
	if total := int(r.total); total > len(buf) {
		buf = make([]byte, total)
		if len(buf) <= rxKeep {
			r.buf = buf
		}
		C.kv_copy(r.rx, (*C.char)(unsafe.Pointer(&buf[0])))
		if r.large = total > rxKeep; r.large {
			trimMalloc(trimAfter)
		}
	}
	frames := r.frames[:0]
	off := 0
	for i := range min(int(n), maxFrames) {
		l := int(r.lens[i])
		frames = append(frames, buf[off:off+l:off+l])
		off += l
	}
	return frames, int(n), nil
}

// readable reports whether sock has a message to read, in one cgo call.
func readable(sock *zmq.Socket) bool {
	if sock == nil {
		return false
	}
	if raw := rawSocket(sock); raw != nil {
		return C.kv_readable(raw) != 0
	}
	ev, err := sock.GetEvents()
	return err == nil && ev&zmq.POLLIN != 0
}

// srcFD returns the file descriptor of the connection the last message
// came on, -1 if unknown (libzmq's ZMQ_SRCFD).
func (r *receiver) srcFD() int { return int(r.fd) }

// drop forgets the frames of a large message, so its buffer can be
// collected.
func (r *receiver) drop() {
	if r.large {
		clear(r.frames[:cap(r.frames)])
		r.large = false
	}
}

// retained is the memory the receiver keeps between messages: its buffer
// and whatever its frame slots still reference.
func (r *receiver) retained() int {
	n := cap(r.buf)
	for _, f := range r.frames[:cap(r.frames)] {
		n += cap(f)
	}
	return n
}

// rawLayout records whether rawSocket's reading of pebbe's Socket was
// confirmed (1) or refuted (-1); 0 until the first socket is checked.
var rawLayout atomic.Int32

// rawSocket returns libzmq's handle of a pebbe socket, or nil if it cannot
// be had safely. pebbe/zmq4 (v1.4.0) keeps the handle unexported as the
// first field of Socket. The first time, the handle is checked: libzmq
// must report the socket type pebbe reports. If not (another pebbe
// layout), every receive falls back to pebbe's API instead of crashing.
func rawSocket(sock *zmq.Socket) unsafe.Pointer {
	if sock == nil || rawLayout.Load() < 0 {
		return nil
	}
	p := *(*unsafe.Pointer)(unsafe.Pointer(sock))
	if p == nil || rawLayout.Load() > 0 {
		return p
	}
	want, err := sock.GetType()
	if err != nil {
		return nil
	}
	if int(C.kv_sock_type(p)) != int(want) {
		rawLayout.Store(-1)
		return nil
	}
	rawLayout.Store(1)
	return p
}

// recvMessage is the fallback receive through pebbe's API. It reads one
// multipart message without blocking, reusing frames' backing array.
func recvMessage(sock *zmq.Socket, frames [][]byte) ([][]byte, int, error) {
	return recvRest(sock, frames[:0], 0)
}

// recvMessagePeer is recvMessage that also returns the message's source
// address (nil if unknown). pebbe reads metadata into a new map per
// frame, so only the first frame is read that way.
func recvMessagePeer(sock *zmq.Socket, frames [][]byte) ([][]byte, int, []byte, error) {
	b, md, err := sock.RecvBytesWithMetadata(zmq.DONTWAIT, peerAddressProperty)
	if err != nil {
		return frames[:0], 0, nil, err
	}
	var peer []byte
	if a := md[peerAddressProperty]; a != "" {
		peer = []byte(a)
	}
	frames = append(frames[:0], b)
	more, err := sock.GetRcvmore()
	if err != nil || !more {
		return frames, 1, peer, err
	}
	frames, n, err := recvRest(sock, frames, 1)
	return frames, n, peer, err
}

// peerAddressProperty is libzmq's message property naming the peer's IP
// address (ZMQ_MSG_PROPERTY_PEER_ADDRESS).
const peerAddressProperty = "Peer-Address"

// recvRest reads the remaining frames of a message of which n were read.
func recvRest(sock *zmq.Socket, frames [][]byte, n int) ([][]byte, int, error) {
	for {
		b, err := sock.RecvBytes(zmq.DONTWAIT)
		if err != nil {
			// libzmq delivers messages atomically, so only the first
			// frame can be missing.
			return frames, n, err
		}
		n++
		if len(frames) < maxFrames {
			frames = append(frames, b)
		}
		more, err := sock.GetRcvmore()
		if err != nil {
			return frames, n, err
		}
		if !more {
			return frames, n, nil
		}
	}
}
