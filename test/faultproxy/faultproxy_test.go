package faultproxy

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestMicroLatencyDelaysEachDirection checks that a round trip through the proxy takes at least
// the delay twice (a lower bound only: upper bounds belong to make bench).
func TestMicroLatencyDelaysEachDirection(t *testing.T) {
	for _, d := range []time.Duration{100 * time.Microsecond, time.Millisecond, 3 * time.Millisecond} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			c, err := ln.Accept()
			if err == nil {
				_, _ = io.Copy(c, c)
			}
		}()
		c, err := net.Dial("tcp", Start(t, ln.Addr().String(), d))
		if err != nil {
			t.Fatal(err)
		}
		msg := make([]byte, 256)
		for range 20 {
			start := time.Now()
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, msg); err != nil {
				t.Fatal(err)
			}
			if rtt := time.Since(start); rtt < 2*d {
				t.Fatalf("delay %s each way, but a round trip took %s", d, rtt)
			}
		}
		_ = c.Close()
	}
}
