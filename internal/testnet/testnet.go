//go:build linux

// Package testnet makes network namespaces joined by veth pairs for tests, and runs code inside
// them. Everything it makes is removed when the test ends; tests use only the addresses it gives.
// It needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN), which the data-plane tests need anyway.
package testnet

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
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

var seq atomic.Int32

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
	n := seq.Add(1)
	id := strconv.Itoa(os.Getpid()%10000) + "x" + strconv.Itoa(int(n))
	net3 := strconv.Itoa(int(n) % 250)
	l := &Link{A: "lst-a-" + id, B: "lst-b-" + id, AIf: "lst" + id + "a", BIf: "lst" + id + "b",
		AAddr: "10.213." + net3 + ".1", BAddr: "10.213." + net3 + ".2"}
	for _, ns := range []string{l.A, l.B} {
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
	}
	ip(tb, "-n", l.A, "link", "add", l.AIf, "type", "veth", "peer", "name", l.BIf, "netns", l.B)
	ip(tb, "-n", l.A, "addr", "add", l.AAddr+"/24", "dev", l.AIf)
	ip(tb, "-n", l.B, "addr", "add", l.BAddr+"/24", "dev", l.BIf)
	ip(tb, "-n", l.A, "link", "set", l.AIf, "up")
	ip(tb, "-n", l.B, "link", "set", l.BIf, "up")
	return l
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
