package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/lockstep-dev/lockstep/test/counter"
)

// TestCounterdSpeaksTheCountersProtocol: the Debian guest's counter answers test/counter's client
// as the busybox guest does (the count, the boot id, what its data sector holds after the write),
// and a counter started again on the same data goes on from the count it holds.
func TestCounterdSpeaksTheCountersProtocol(t *testing.T) {
	data := filepath.Join(t.TempDir(), "counter")
	if err := os.WriteFile(data, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	serve := func() (*service, string) {
		c, err := open(data)
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		go func() { _ = c.serveAll(l) }()
		return c, l.Addr().String()
	}
	c, addr := serve()
	for want := 1; want <= 3; want++ {
		r, err := counter.Ask(context.Background(), "", addr)
		if err != nil {
			t.Fatal(err)
		}
		if r.Count != want || r.Disk != want || r.BootID != c.bootID || r.BootID == "" {
			t.Fatalf("reply %+v, want count and disk %d, boot id %s", r, want, c.bootID)
		}
	}
	again, addr := serve()
	if again.count != 3 {
		t.Fatalf("started again on the same data, it counts from %d, want 3", again.count)
	}
	if r, err := counter.Ask(context.Background(), "", addr); err != nil || r.Count != 4 || r.Disk != 4 {
		t.Fatalf("after the restart: %+v, %v; want count 4", r, err)
	}
}
