//go:build linux

// Package testnet makes network namespaces joined by veth pairs for tests, and runs code inside
// them. Everything it makes is removed when the test ends; tests use only the addresses it gives.
// It needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN), which the data-plane tests need anyway.
package testnet

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netns"
)

// Link is two namespaces, A and B, joined by a veth pair: A's end AIf has AAddr, B's end BIf has
// BAddr (IPv4 /24; IPv6 is off so that neighbour discovery adds no packets).
type Link struct {
	A, B         string // namespace names
	AIf, BIf     string
	AAddr, BAddr string
}

var seq, nsSeq atomic.Int32

// ip runs the ip command.
func ip(tb testing.TB, args ...string) {
	tb.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		tb.Fatalf("ip %s: %v\n%s(the data-plane tests need root: they create network namespaces)", strings.Join(args, " "), err, out)
	}
}

// NewLink makes a new pair of namespaces joined by a veth pair, on subnet 10.213.<n>.0/24.
func NewLink(tb testing.TB) *Link {
	tb.Helper()
	b := newNS(tb)
	return linkTo(tb, b)
}

// NetNSPath is the path of a namespace made by NewLink.
func NetNSPath(name string) string { return "/var/run/netns/" + name }

// SetLink sets the link's A end up or down: a partition of the two namespaces.
func (l *Link) SetLink(tb testing.TB, up bool) {
	state := "down"
	if up {
		state = "up"
	}
	ip(tb, "-n", l.A, "link", "set", l.AIf, state)
}

// In runs fn on an OS thread inside the namespace: sockets it opens belong to that namespace.
func In(tb testing.TB, name string, fn func()) {
	tb.Helper()
	if err := Enter(name, fn); err != nil {
		tb.Fatal(err)
	}
}

// Enter is In for goroutines other than the test's: it returns the error.
func Enter(name string, fn func()) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer func() { _ = orig.Close() }()
	ns, err := netns.GetFromName(name)
	if err != nil {
		return err
	}
	defer func() { _ = ns.Close() }()
	if err := netns.Set(ns); err != nil {
		return err
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(err) // a thread left in the wrong namespace must not be reused
		}
	}()
	fn()
	return nil
}

// DialContext dials addr from inside namespace ns ("" for the test's own): the connection
// belongs to that namespace.
func DialContext(ctx context.Context, ns, network, addr string) (net.Conn, error) {
	var d net.Dialer
	if ns == "" {
		return d.DialContext(ctx, network, addr)
	}
	var c net.Conn
	var err error
	if e := Enter(ns, func() { c, err = d.DialContext(ctx, network, addr) }); e != nil {
		return nil, e
	}
	return c, err
}

// Star is a hub namespace and a leaf namespace per name, each leaf joined to the hub by two veth
// pairs: a data link (leaf Data[i].A side, hub .B side; the leaf routes everything else through
// the hub) and a VM link (VM[i]) that carries what the leaf's VM sends to clients, so that a
// test can gate one without the other.
type Star struct {
	Hub    string
	Leaves []string
	Data   []*Link
	VM     []*Link
}

// NewStar makes a star with n leaves.
func NewStar(tb testing.TB, n int) *Star {
	tb.Helper()
	s := &Star{}
	first := NewLink(tb)
	s.Hub = first.B
	for i := range n {
		var data *Link
		if i == 0 {
			data = first
		} else {
			data = linkTo(tb, s.Hub)
		}
		s.Data = append(s.Data, data)
		s.Leaves = append(s.Leaves, data.A)
		s.VM = append(s.VM, linkBetween(tb, data.A, s.Hub))
		ip(tb, "-n", data.A, "route", "add", "default", "via", data.BAddr)
	}
	return s
}

// NewNS makes a namespace with its loopback up and IPv6 off, removed when the test ends.
func NewNS(tb testing.TB) string { return newNS(tb) }

// newNS makes a namespace with its loopback up and IPv6 off, removed when the test ends.
func newNS(tb testing.TB) string {
	tb.Helper()
	ns := "lst-" + strconv.Itoa(os.Getpid()%10000) + "n" + strconv.Itoa(int(nsSeq.Add(1)))
	ip(tb, "netns", "add", ns)
	tb.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	In(tb, ns, func() {
		for _, conf := range []string{"all", "default"} {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+conf+"/disable_ipv6", []byte("1"), 0o644); err != nil {
				tb.Fatal(err)
			}
		}
	})
	ip(tb, "-n", ns, "link", "set", "lo", "up")
	return ns
}

// linkTo makes a new namespace joined to an existing one (the new one is A).
func linkTo(tb testing.TB, b string) *Link {
	tb.Helper()
	return linkBetween(tb, newNS(tb), b)
}

// linkBetween joins two existing namespaces with a new veth pair.
func linkBetween(tb testing.TB, a, b string) *Link {
	tb.Helper()
	n := seq.Add(1)
	return veth(tb, a, b, strconv.Itoa(os.Getpid()%10000)+"x"+strconv.Itoa(int(n)), n)
}

func veth(tb testing.TB, a, b, id string, n int32) *Link {
	net3 := strconv.Itoa(int(n) % 250)
	l := &Link{A: a, B: b, AIf: "lst" + id + "a", BIf: "lst" + id + "b",
		AAddr: "10.213." + net3 + ".1", BAddr: "10.213." + net3 + ".2"}
	ip(tb, "-n", l.A, "link", "add", l.AIf, "type", "veth", "peer", "name", l.BIf, "netns", l.B)
	ip(tb, "-n", l.A, "addr", "add", l.AAddr+"/24", "dev", l.AIf)
	ip(tb, "-n", l.B, "addr", "add", l.BAddr+"/24", "dev", l.BIf)
	ip(tb, "-n", l.A, "link", "set", l.AIf, "up")
	ip(tb, "-n", l.B, "link", "set", l.BIf, "up")
	return l
}

// Forward accepts TCP connections on listenAddr inside namespace listenNS ("" for the test's
// own) and forwards each to dialAddr inside dialNS: a way for a process in a test namespace to
// reach a server on the test's loopback (the API server), or for the test to reach one inside a
// namespace. It returns the bound address and a switch: off closes every forwarded connection and
// refuses new ones (the server is unreachable) until switched on again.
func Forward(tb testing.TB, listenNS, listenAddr, dialNS, dialAddr string) (string, func(on bool)) {
	tb.Helper()
	var ln net.Listener
	listen := func() {
		var err error
		if ln, err = net.Listen("tcp", listenAddr); err != nil {
			tb.Fatal(err)
		}
	}
	if listenNS == "" {
		listen()
	} else {
		In(tb, listenNS, listen)
	}
	tb.Cleanup(func() { _ = ln.Close() })
	var (
		mu    sync.Mutex
		on    = true
		conns = map[net.Conn]bool{}
	)
	dial := func() (net.Conn, error) { return DialContext(context.Background(), dialNS, "tcp", dialAddr) }
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			ok := on
			mu.Unlock()
			if !ok {
				_ = in.Close()
				continue
			}
			out, err := dial()
			if err != nil {
				_ = in.Close()
				continue
			}
			mu.Lock()
			conns[in], conns[out] = true, true
			mu.Unlock()
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				_ = dst.Close()
				_ = src.Close()
				mu.Lock()
				delete(conns, dst)
				delete(conns, src)
				mu.Unlock()
			}
			go pipe(in, out)
			go pipe(out, in)
		}
	}()
	return ln.Addr().String(), func(state bool) {
		mu.Lock()
		defer mu.Unlock()
		on = state
		if !on {
			for c := range conns {
				_ = c.Close()
			}
		}
	}
}

// SetDown sets a link's A end down (true) or up: a partition of the two namespaces.
func (l *Link) SetDown(tb testing.TB, down bool) { l.SetLink(tb, !down) }
