//go:build linux

package netgate

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/testnet"
)

// TestPacketsLeaveOnlyAfterTheirPositionIsAcknowledged sends UDP datagrams from the VM host, each
// after a log position, through a real kernel gate, and checks that the client receives exactly
// those whose position is acknowledged, in order; that a fenced gate drops what it held; and
// that closing the gate removes its rule.
func TestPacketsLeaveOnlyAfterTheirPositionIsAcknowledged(t *testing.T) {
	h := testnet.NewLink(t) // A is the VM's host, B the client
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var recv net.PacketConn
	testnet.In(t, h.B, func() {
		var err error
		if recv, err = net.ListenPacket("udp4", h.BAddr+":9999"); err != nil {
			t.Fatal(err)
		}
	})
	defer func() { _ = recv.Close() }()
	got := make(chan int, 1000)
	go func() {
		buf := make([]byte, 64)
		for {
			n, _, err := recv.ReadFrom(buf)
			if err != nil {
				return
			}
			v, _ := strconv.Atoi(string(buf[:n]))
			got <- v
		}
	}()
	var send net.Conn
	testnet.In(t, h.A, func() {
		var err error
		if send, err = net.Dial("udp4", h.BAddr+":9999"); err != nil {
			t.Fatal(err)
		}
	})
	defer func() { _ = send.Close() }()

	var position atomic.Uint64
	g, err := Open(ctx, Config{NetNS: testnet.NetNSPath(h.A), Interface: h.AIf, Hook: HookOutput, Queue: 7}, position.Load)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = g.Close()
		}
	}()

	// emit sends datagram i after log entry i. lockstepd reads the queue a little after the
	// kernel queued a packet, so a packet may be tagged with a later position than the one it
	// followed: that only holds it longer, never less. To check positions exactly, the test lets
	// each packet reach the gate before the log moves on.
	emit := func(from, to int) {
		for i := from; i <= to; i++ {
			position.Store(uint64(i))
			queued := g.Stats().Queued
			if _, err := fmt.Fprint(send, i); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for g.Stats().Queued == queued {
				if time.Now().After(deadline) {
					t.Fatalf("datagram %d never reached the gate (%+v)", i, g.Stats())
				}
				time.Sleep(100 * time.Microsecond)
			}
		}
	}
	expect := func(from, to int) {
		t.Helper()
		for want := from; want <= to; want++ {
			select {
			case v := <-got:
				if v != want {
					t.Fatalf("received %d, want %d", v, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("datagram %d never arrived (gate %+v, %d held)", want, g.Stats(), g.Held())
			}
		}
	}
	nothing := func(why string) {
		t.Helper()
		select {
		case v := <-got:
			t.Fatalf("%s: datagram %d arrived", why, v)
		case <-time.After(300 * time.Millisecond):
		}
	}

	emit(1, 50)
	waitHeld(t, g, 50)
	nothing("before any acknowledgement")
	g.Ack(25)
	expect(1, 25)
	nothing("after the acknowledgement of 25")
	g.Ack(50)
	expect(26, 50)

	emit(51, 60)
	waitHeld(t, g, 10)
	g.Fence()
	g.Ack(60)
	emit(61, 62)
	nothing("after fencing")
	if s := g.Stats(); s.Dropped != 12 || s.Released != 50 {
		t.Fatalf("stats %+v: want 50 released and 12 dropped", s)
	}

	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	if _, err := fmt.Fprint(send, 63); err != nil {
		t.Fatal(err)
	}
	expect(63, 63) // no rule, no gate
}

func waitHeld(t *testing.T, g *Gate, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for g.Held() < n {
		if time.Now().After(deadline) {
			t.Fatalf("the kernel queued %d packets, want %d (stats %+v)", g.Held(), n, g.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
