package gateway

import (
	"bytes"
	"testing"
)

func TestBodyPresize(t *testing.T) {
	const maxBody = 8 << 20
	for _, c := range []struct {
		name          string
		contentLength string
		frame         int
		want          int
	}{
		{"announced length", "110000", 16384, 110000},
		{"announced beyond the presize bound", "4000000", 16384, maxBodyPresize},
		{"announced beyond MaxBody", "9000000", 16384, 2 * 16384},
		{"twice the frame beyond MaxBody", "", 6 << 20, maxBody},
		{"announced no more than the frame", "100", 16384, 2 * 16384},
		{"no length", "", 16384, 2 * 16384},
		{"bad length", "12x", 16384, 2 * 16384},
		{"frame above the presize bound", "4000000", maxBodyPresize + 1, maxBodyPresize + 1},
	} {
		if got := bodyPresize(c.contentLength, c.frame, maxBody); got != c.want {
			t.Errorf("%s: bodyPresize(%q, %d) = %d, want %d", c.name, c.contentLength, c.frame, got, c.want)
		}
	}
}

func TestBodyBuffers(t *testing.T) {
	for _, n := range []int{0, 1, 4096, 4097, 100_000, 1 << maxBodyShift, 1<<maxBodyShift + 1} {
		b := getBody(n, 1<<30)
		if len(b) != 0 || cap(b) < n {
			t.Fatalf("getBody(%d): len %d cap %d", n, len(b), cap(b))
		}
		putBody(b)
	}
	// A body that grows frame by frame through several classes keeps its
	// bytes, and a recycled buffer comes back empty.
	var want []byte
	body := getBody(10, 1<<30)
	for i := range 40 {
		frame := bytes.Repeat([]byte{byte('a' + i%26)}, 1000+i*37)
		body = appendBody(body, frame, 1<<30)
		want = append(want, frame...)
	}
	if !bytes.Equal(body, want) {
		t.Fatal("appendBody lost or reordered bytes")
	}
	putBody(body)
	if b := getBody(len(want), 1<<30); len(b) != 0 {
		t.Fatalf("a recycled buffer has length %d", len(b))
	}
	// The capacity stays within the limit when the body does: no class
	// rounds a 5,000-byte body of a 6,000-byte limit up to 8 KiB.
	if b := getBody(5000, 6000); cap(b) > 6000 {
		t.Fatalf("getBody(5000, 6000) has capacity %d", cap(b))
	}
	if b := appendBody(make([]byte, 3000), make([]byte, 2000), 6000); cap(b) > 6000 || len(b) != 5000 {
		t.Fatalf("appendBody past a 6,000-byte limit: len %d cap %d", len(b), cap(b))
	}
	// A buffer whose capacity is not a class's is not pooled (it would
	// break the class's capacity guarantee).
	putBody(make([]byte, 0, 5000))
	for range 4 {
		if b := getBody(5000, 1<<30); cap(b) < 5000 {
			t.Fatalf("getBody(5000) has capacity %d", cap(b))
		}
	}
}
