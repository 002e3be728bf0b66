package relay_test

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// checkpointBytes is about what one COLO checkpoint of the VM tier's busy 256 MB guest carries
// (docs/colo.md: 2 to 3 MB of dirty pages and device state).
const checkpointBytes = 2500 << 10

// secondaryQEMU serves a Unix socket as the secondary's migration stream does: it reads a whole
// checkpoint, then answers with a 4-byte message (vmstate-received).
func secondaryQEMU(b *testing.B, path string) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer func() { _ = c.Close() }()
		buf := make([]byte, checkpointBytes)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write([]byte{0, 0, 0, 5}); err != nil {
				return
			}
		}
	}()
}

// checkpoints sends b.N checkpoints down c and waits for each one's answer: the part of COLO's
// pause that is the stream (the primary's migration thread writing, the secondary reading it).
func checkpoints(b *testing.B, c net.Conn) {
	page := make([]byte, checkpointBytes)
	reply := make([]byte, 4)
	b.SetBytes(checkpointBytes)
	b.ResetTimer()
	cpu0 := cpuTime(b)
	defer func() { b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op") }()
	for range b.N {
		if _, err := c.Write(page); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, reply); err != nil {
			b.Fatal(err)
		}
	}
}

// cpuTime is the CPU time this process has used, both relays' and both QEMUs' included: on a
// busy machine it says more of what a change costs than the time per checkpoint does.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCheckpointStream is one checkpoint's stream from the primary's QEMU to the
// secondary's and its answer back: through a Forward and a Server over TLS on loopback (relayed),
// beside the same over one Unix socket (direct), the floor that no relay can beat. Compare the
// two as a ratio from one run.
func BenchmarkCheckpointStream(b *testing.B) {
	b.Run("direct", func(b *testing.B) {
		path := filepath.Join(b.TempDir(), "qemu.sock")
		secondaryQEMU(b, path)
		c, err := net.Dial("unix", path)
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		checkpoints(b, c)
	})
	b.Run("relayed", func(b *testing.B) {
		n := newNodes(b)
		path := filepath.Join(n.dir, "qemu.sock")
		secondaryQEMU(b, path)
		n.server.Route("ns", "vm", "migration", path)
		f := n.forward(b, context.Background(), "migration", nil)
		c, err := net.Dial("unix", f.Path)
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		checkpoints(b, c)
	})
}
