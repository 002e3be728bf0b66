package relay

import (
	"crypto/tls"
	"net"
	"sync"
)

// batchConn is the TCP connection under a stream's TLS connection. While held, it collects what
// TLS writes instead of writing it, so that the records TLS seals for one chunk of a stream
// (16 KiB each) leave in one write: a checkpoint of a few megabytes is then tens of writes, not
// hundreds, each of which on loopback or a veth also runs the receiver's network stack.
type batchConn struct {
	net.Conn

	mu   sync.Mutex
	hold bool
	buf  []byte
}

func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.hold {
		// TLS writes under its own lock, so records arrive here in the order it sealed them,
		// including any that its reading side writes meanwhile (a key update's answer).
		b.buf = append(b.buf, p...)
		return len(p), nil
	}
	return b.Conn.Write(p)
}

// tlsBatched is a stream's TLS connection whose every Write leaves in one write to the network.
type tlsBatched struct {
	*tls.Conn
	raw *batchConn
}

func (t tlsBatched) Write(p []byte) (int, error) {
	t.raw.mu.Lock()
	t.raw.hold = true
	t.raw.mu.Unlock()
	n, err := t.Conn.Write(p)

	t.raw.mu.Lock()
	defer t.raw.mu.Unlock()
	t.raw.hold = false
	out := t.raw.buf
	t.raw.buf = out[:0]
	if len(out) > 0 {
		if _, werr := t.raw.Conn.Write(out); werr != nil && err == nil {
			err = werr
		}
	}
	return n, err
}
