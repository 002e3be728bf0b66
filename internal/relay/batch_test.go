package relay

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"sync/atomic"
	"testing"

	"github.com/lockstep-dev/lockstep/test/pki"
)

// countingConn counts the writes that reach the network.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestAStreamChunkLeavesInOneWrite: a chunk of 200 KiB is thirteen TLS records; they leave in one
// write to the network, and arrive whole and in order.
func TestAStreamChunkLeavesInOneWrite(t *testing.T) {
	ca := pki.New(t, "ca")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	msg := bytes.Repeat([]byte("0123456789abcdef"), 200<<10/16)
	got := make(chan []byte, 1)
	go func() {
		raw, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		c := tls.Server(raw, ca.TLSConfig(t, "node-b"))
		defer func() { _ = c.Close() }()
		b := make([]byte, 2*len(msg))
		_, err = io.ReadFull(c, b)
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()

	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	counted := &countingConn{Conn: raw}
	bc := &batchConn{Conn: counted}
	c := tlsBatched{tls.Client(bc, ca.TLSConfig(t, "node-a")), bc}
	defer func() { _ = c.Close() }()
	if err := c.Handshake(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		before := counted.writes.Load()
		if n, err := c.Write(msg); err != nil || n != len(msg) {
			t.Fatalf("wrote %d of %d: %v", n, len(msg), err)
		}
		if w := counted.writes.Load() - before; w != 1 {
			t.Fatalf("a chunk of %d bytes left in %d writes, want 1", len(msg), w)
		}
	}
	if b := <-got; !bytes.Equal(b, append(append([]byte{}, msg...), msg...)) {
		t.Fatal("the chunks arrived altered")
	}
}
