//go:build linux

package netgate

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// twoHosts is a "VM host" and a "client" network namespace joined by a veth pair, made for the
// test and removed after it: the only addresses the test uses are inside them.
type twoHosts struct {
	vm, client string // namespace names
	vmIf       string // the VM host's end of the link: the gated interface
	clientAddr string
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s(the data-plane tests need root: they create network namespaces)", strings.Join(args, " "), err, out)
	}
}

func newTwoHosts(t *testing.T) *twoHosts {
	id := strconv.Itoa(os.Getpid() % 100000)
	h := &twoHosts{vm: "lsg-vm-" + id, client: "lsg-cl-" + id, vmIf: "lsg" + id + "a", clientAddr: "10.213.0.2"}
	ip(t, "netns", "add", h.vm)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", h.vm).Run() })
	ip(t, "netns", "add", h.client)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", h.client).Run() })
	// IPv4 only: IPv6 neighbour discovery would add packets of its own to the gated link.
	for _, ns := range []string{h.vm, h.client} {
		inNS(t, ns, func() {
			for _, conf := range []string{"all", "default"} {
				if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+conf+"/disable_ipv6", []byte("1"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	ip(t, "-n", h.vm, "link", "add", h.vmIf, "type", "veth", "peer", "name", "lsg"+id+"b", "netns", h.client)
	ip(t, "-n", h.vm, "addr", "add", "10.213.0.1/24", "dev", h.vmIf)
	ip(t, "-n", h.client, "addr", "add", h.clientAddr+"/24", "dev", "lsg"+id+"b")
	for _, ns := range []string{h.vm, h.client} {
		ip(t, "-n", ns, "link", "set", "lo", "up")
	}
	ip(t, "-n", h.vm, "link", "set", h.vmIf, "up")
	ip(t, "-n", h.client, "link", "set", "lsg"+id+"b", "up")
	return h
}

// inNS runs fn on a thread inside the named namespace: sockets it opens belong there.
func inNS(t *testing.T, name string, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = orig.Close() }()
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ns.Close() }()
	if err := netns.Set(ns); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = netns.Set(orig) }()
	fn()
}

// TestPacketsLeaveOnlyAfterTheirPositionIsAcknowledged sends UDP datagrams from the VM host, each
// after a log position, through a real kernel gate, and checks that the client receives exactly
// those whose position is acknowledged, in order; that a fenced gate drops what it held; and
// that closing the gate removes its rule.
func TestPacketsLeaveOnlyAfterTheirPositionIsAcknowledged(t *testing.T) {
	h := newTwoHosts(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var recv net.PacketConn
	inNS(t, h.client, func() {
		var err error
		if recv, err = net.ListenPacket("udp4", h.clientAddr+":9999"); err != nil {
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
	inNS(t, h.vm, func() {
		var err error
		if send, err = net.Dial("udp4", h.clientAddr+":9999"); err != nil {
			t.Fatal(err)
		}
	})
	defer func() { _ = send.Close() }()

	var position atomic.Uint64
	g, err := Open(ctx, Config{NetNS: "/var/run/netns/" + h.vm, Interface: h.vmIf, Hook: HookOutput, Queue: 7}, position.Load)
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
