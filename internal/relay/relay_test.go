package relay_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/nodecert"
	"github.com/lockstep-dev/lockstep/internal/relay"
	"github.com/lockstep-dev/lockstep/test/pki"
)

// echo serves a Unix socket that sends back what it reads, as QEMU's side of a stream.
func echo(t *testing.T, path string) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); _ = c.Close() }()
		}
	}()
}

type nodes struct {
	ca     *pki.CA
	server *relay.Server // node-b's, which serves pair "ns" to node-a only
	addr   string
	dir    string
	tlsA   *tls.Config
}

func newNodes(t testing.TB) *nodes {
	ca := pki.New(t, "ca")
	n := &nodes{ca: ca, dir: t.TempDir(), tlsA: ca.TLSConfig(t, "node-a"), server: &relay.Server{TLS: ca.TLSConfig(t, "node-b"),
		Authorize: func(pair, node string) error {
			if pair != "ns" || node != "node-a" {
				return fmt.Errorf("node %s holds no member of pair %s", node, pair)
			}
			return nil
		}}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = n.server.Serve(ctx, ln) }()
	return n
}

// target is member vm of pair ns on node-b.
func (n *nodes) target() relay.Target {
	return relay.Target{Addr: n.addr, Node: "node-b", Key: relay.Key("ns", "vm")}
}

func (n *nodes) forward(t testing.TB, ctx context.Context, stream string, fromPeer func([]byte)) *relay.Forward {
	f := &relay.Forward{Stream: stream, Path: filepath.Join(n.dir, stream+".fwd"),
		Peer: func() relay.Target { return n.target() }, TLS: n.tlsA, FromPeer: fromPeer}
	if err := f.Listen(ctx); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestForwardCarriesBothWaysAndCounts(t *testing.T) {
	n := newNodes(t)
	qemuSock := filepath.Join(n.dir, "qemu.sock")
	echo(t, qemuSock)
	served := n.server.Route("ns", "vm", "migration", qemuSock)
	var mu sync.Mutex
	var seen []byte
	f := n.forward(t, context.Background(), "migration", func(b []byte) { mu.Lock(); seen = append(seen, b...); mu.Unlock() })

	c, err := net.Dial("unix", f.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	msg := bytes.Repeat([]byte("checkpoint"), 10000)
	go func() { _, _ = c.Write(msg) }()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("the stream came back altered")
	}
	mu.Lock()
	observed := len(seen)
	mu.Unlock()
	if observed != len(msg) {
		t.Fatalf("FromPeer saw %d bytes, want %d", observed, len(msg))
	}
	// A chunk is counted once it was written on: the last ones may trail the echo a little.
	want := uint64(len(msg))
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if f.Sent() == want && f.Received() == want && served.Received() == want && served.Sent() == want {
			break
		}
	}
	if f.Sent() != want || f.Received() != want || served.Received() != want || served.Sent() != want {
		t.Fatalf("counters: forward %d/%d, server %d/%d, want %d each", f.Sent(), f.Received(), served.Sent(), served.Received(), len(msg))
	}
}

// openStream connects to a forward's socket and checks one byte's round trip through the echo.
func openStream(t *testing.T, path string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	return c
}

// closed reports whether c is closed by the other end within 10 s (a refusal follows a TLS
// handshake, slow on a busy machine). A close with our bytes still unread on the other side comes
// as a reset (ECONNRESET) instead of EOF: closed too. Only the deadline passing is not.
func closed(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && (!errors.As(err, &ne) || !ne.Timeout())
}

func TestUnknownStreamIsRefusedAndUnrouteCuts(t *testing.T) {
	n := newNodes(t)
	f := n.forward(t, context.Background(), "nbd", nil)
	c, err := net.Dial("unix", f.Path)
	if err != nil {
		t.Fatal(err)
	}
	if !closed(c) {
		t.Fatal("a stream with no route was not refused")
	}

	qemuSock := filepath.Join(n.dir, "qemu.sock")
	echo(t, qemuSock)
	n.server.Route("ns", "vm", "nbd", qemuSock)
	c = openStream(t, f.Path)
	n.server.Unroute("ns", "vm", "nbd")
	if !closed(c) {
		t.Fatal("Unroute did not cut the open stream")
	}
}

// A secondary's packet stream (Once): QEMU's filter-redirector reads its socket only until the
// first disconnect. So while the primary's side has no route yet, the Forward keeps QEMU's
// connection open and dials again; once routed the stream flows on that same connection; and
// after it ended, QEMU's next connection is closed at once rather than carried to a peer that
// would write into it with nobody reading.
func TestAOnceForwardHoldsQEMUsConnectionUntilRoutedAndCarriesOnlyOne(t *testing.T) {
	n := newNodes(t)
	f := &relay.Forward{Stream: "mirror", Path: filepath.Join(n.dir, "mirror.fwd"), Once: true,
		Peer: func() relay.Target { return n.target() }, TLS: n.tlsA}
	if err := f.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("unix", f.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	// Refused for a while (each refusal follows a handshake): the connection stays open.
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := c.Read(make([]byte, 1)); !isTimeout(err) {
		t.Fatalf("QEMU's connection ended while the peer had no route: %v", err)
	}
	_ = c.SetReadDeadline(time.Time{})

	qemuSock := filepath.Join(n.dir, "qemu.sock")
	echo(t, qemuSock)
	n.server.Route("ns", "vm", "mirror", qemuSock)
	msg := []byte("the packets flow once routed")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("through the held connection: %q, %v", got, err)
	}

	n.server.Unroute("ns", "vm", "mirror")
	if !closed(c) {
		t.Fatal("Unroute did not cut the carried stream")
	}
	n.server.Route("ns", "vm", "mirror", qemuSock)
	again, err := net.Dial("unix", f.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = again.Close() }()
	if !closed(again) {
		t.Fatal("a second connection of QEMU's was carried after the first ended")
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestForwardCutsItsStreamsWhenStopped(t *testing.T) {
	n := newNodes(t)
	qemuSock := filepath.Join(n.dir, "qemu.sock")
	echo(t, qemuSock)
	n.server.Route("ns", "vm", "mirror", qemuSock)
	ctx, cancel := context.WithCancel(context.Background())
	f := n.forward(t, ctx, "mirror", nil)
	c := openStream(t, f.Path)
	cancel()
	if !closed(c) {
		t.Fatal("stopping the forward left its stream open")
	}
}

func TestPeerWithoutCertificateIsRefused(t *testing.T) {
	n := newNodes(t)
	qemuSock := filepath.Join(n.dir, "qemu.sock")
	echo(t, qemuSock)
	n.server.Route("ns", "vm", "migration", qemuSock)
	raw, err := net.Dial("tcp", n.addr)
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}) //nolint:gosec // the test plays a peer without a certificate
	_, _ = io.WriteString(c, "ns/vm\x00migration\n")
	_, _ = c.Write([]byte("x"))
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("a peer without a client certificate reached QEMU's stream")
	}
}

func TestProbe(t *testing.T) {
	n := newNodes(t)
	if err := relay.Probe(context.Background(), n.target(), n.tlsA, nil); err != nil {
		t.Fatalf("probe of a live server: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	_ = ln.Close()
	if err := relay.Probe(context.Background(), relay.Target{Addr: dead}, n.tlsA, nil); err == nil {
		t.Fatal("probe of a closed port succeeded")
	}
}

// TestOnlyThePairsOtherNodeReachesItsStreams: node-b's server refuses the streams of its pair to
// a third node's lockstepd, and a forward refuses a server that is not the node it expects,
// although every certificate is signed by the same CA.
func TestOnlyThePairsOtherNodeReachesItsStreams(t *testing.T) {
	n := newNodes(t)
	qemuSock := filepath.Join(n.dir, "qemu.sock")
	echo(t, qemuSock)
	n.server.Route("ns", "vm", "migration", qemuSock)
	third := &relay.Forward{Stream: "migration", Path: filepath.Join(n.dir, "third.fwd"), Peer: n.target, TLS: n.ca.TLSConfig(t, "node-c")}
	if err := third.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("unix", third.Path)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte("x"))
	if !closed(c) {
		t.Fatal("a third node's lockstepd reached the pair's stream")
	}
	if n.server.Refused() == 0 {
		t.Fatal("the server counted no refusal")
	}
	wrong := n.target()
	wrong.Node = "node-x"
	if err := relay.Probe(context.Background(), wrong, n.tlsA, nil); !errors.Is(err, nodecert.ErrWrongNode) {
		t.Fatalf("a probe that expects node-x of node-b's server: %v", err)
	}
	if err := relay.Probe(context.Background(), n.target(), n.tlsA, nil); err != nil {
		t.Fatalf("the pair's own node: %v", err)
	}
}

// TestAForwardGivesItsSocketToQEMUsUser: the socket QEMU connects to is the user's that the
// launcher runs QEMU as (KubeVirt's 107), so that it may connect.
func TestAForwardGivesItsSocketToQEMUsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving a socket to another user needs root (CI runs as root)")
	}
	f := &relay.Forward{Stream: "migration", Path: filepath.Join(t.TempDir(), "migration.sock"), Owner: &relay.Owner{UID: 107, GID: 107}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := f.Listen(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(f.Path)
	if err != nil {
		t.Fatal(err)
	}
	if sys := st.Sys().(*syscall.Stat_t); sys.Uid != 107 || sys.Gid != 107 {
		t.Fatalf("the socket is %d:%d, want 107:107", sys.Uid, sys.Gid)
	}
	for _, bad := range []string{"qemu", "107:x", "-1"} {
		if _, err := relay.ParseOwner(bad); err == nil {
			t.Errorf("ParseOwner(%q) took it", bad)
		}
	}
	if o, err := relay.ParseOwner("107"); err != nil || *o != (relay.Owner{UID: 107, GID: 107}) {
		t.Errorf("ParseOwner(107): %v, %v", o, err)
	}
}
