package channel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/ftlog"
	"github.com/lockstep-dev/lockstep/internal/gate"
	"github.com/lockstep-dev/lockstep/test/pki"
)

// cutter forwards loopback TCP connections to target and can sever all of them at once, as a
// broken logging link does (in flight data either way is lost).
type cutter struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
}

func newCutter(t *testing.T, target string) *cutter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cutter{ln: ln, target: target}
	t.Cleanup(func() { _ = ln.Close(); c.cut() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			c.mu.Lock()
			c.conns = append(c.conns, in, out)
			c.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
	return c
}

func (c *cutter) addr() string { return c.ln.Addr().String() }

func (c *cutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	c.conns = nil
}

type pairUnderTest struct {
	primary   *Primary
	secondary *Secondary
	listener  net.Listener
	resigned  chan string // the reasons the secondary was given
	mu        sync.Mutex
	applied   []ftlog.Entry
}

// withPairCerts is cfg for a pair's secondary and for its primary, each with a certificate of one
// new CA.
func withPairCerts(t *testing.T, cfg Config) (secondary, primary Config) {
	ca := pki.New(t, "lockstep-ca")
	secondary, primary = cfg, cfg
	secondary.TLS, primary.TLS = ca.TLSConfig(t, "lockstepd"), ca.TLSConfig(t, "lockstepd")
	return secondary, primary
}

func startPair(t *testing.T, ctx context.Context, cfg Config, via func(string) string) *pairUnderTest {
	t.Helper()
	p := &pairUnderTest{resigned: make(chan string, 1)}
	scfg, pcfg := withPairCerts(t, cfg)
	p.secondary = NewSecondary(scfg, func(e ftlog.Entry) error {
		p.mu.Lock()
		p.applied = append(p.applied, e)
		p.mu.Unlock()
		return nil
	})
	p.secondary.OnResign = func(reason string) {
		select {
		case p.resigned <- reason:
		default:
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.listener = ln
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	wg.Add(2)
	go func() { defer wg.Done(); _ = p.secondary.Serve(ctx, ln) }()
	p.primary = NewPrimary(pcfg, via(ln.Addr().String()), 1)
	go func() { defer wg.Done(); _ = p.primary.Run(ctx) }()
	return p
}

// TestEveryEntryArrivesOnceInOrderWhileTheLinkBreaks streams entries over TLS through a link that
// is cut every few milliseconds. Each entry must be applied exactly once and in order, outputs
// gated on the acknowledgements must never leave before their position is acknowledged, and the
// stream must end fully acknowledged.
func TestEveryEntryArrivesOnceInOrderWhileTheLinkBreaks(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var link *cutter
	p := startPair(t, ctx, Config{Pair: "ns/db", Window: ftlog.Window{Entries: 256, Bytes: 1 << 20}},
		func(addr string) string { link = newCutter(t, addr); return link.addr() })

	var g gate.Gate[uint64]
	var gmu sync.Mutex
	var released []uint64
	var ackedSeen uint64
	release := func(out []uint64) {
		for _, pos := range out {
			if pos > ackedSeen {
				t.Errorf("output after %d released with %d acknowledged", pos, ackedSeen)
			}
			released = append(released, pos)
		}
	}
	p.primary.OnAck = func(seq uint64) {
		gmu.Lock()
		defer gmu.Unlock()
		if seq < ackedSeen {
			t.Errorf("acknowledgement went back from %d to %d", ackedSeen, seq)
		}
		ackedSeen = seq
		release(g.Ack(seq))
	}

	stopCutting := make(chan struct{})
	var cuts atomic.Int64
	go func() {
		// Cut at random moments, but only once the link has carried something since the last
		// cut, so that the stream progresses however slow the machine (or -race) is.
		r := rand.New(rand.NewPCG(1, 2))
		var lastAcked uint64
		for {
			select {
			case <-stopCutting:
				return
			case <-time.After(time.Duration(2+r.IntN(20)) * time.Millisecond):
				if a := p.primary.Stats().Acked; a > lastAcked {
					lastAcked = a
					link.cut()
					cuts.Add(1)
				}
			}
		}
	}()
	const n = 20000
	for i := range n {
		seq, err := p.primary.Append(ctx, []byte(fmt.Sprint("entry-", i)))
		if err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 { // an output produced after this entry
			gmu.Lock()
			out, err := g.Hold(seq, seq)
			if err != nil {
				t.Fatal(err)
			}
			release(out)
			gmu.Unlock()
		}
	}
	close(stopCutting)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := p.primary.WaitAcked(wctx, n); err != nil {
		t.Fatalf("not all acknowledged: %v (stats %+v)", err, p.primary.Stats())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.applied) != n {
		t.Fatalf("applied %d entries, want %d", len(p.applied), n)
	}
	for i, e := range p.applied {
		if e.Seq != uint64(i+1) || string(e.Data) != fmt.Sprint("entry-", i) {
			t.Fatalf("applied #%d is %d %q", i, e.Seq, e.Data)
		}
	}
	gmu.Lock()
	defer gmu.Unlock()
	if len(released) != n/10 || g.Held() != 0 {
		t.Fatalf("released %d outputs, %d held", len(released), g.Held())
	}
	t.Logf("%d entries over %d connections (%d cuts); vLockstep interval %v", n, p.primary.Stats().Connections, cuts.Load(), p.primary.Stats().Interval)
}

func TestAPeerFromAnotherCAOrPairIsRefused(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := startPair(t, ctx, Config{Pair: "ns/db"}, func(a string) string { return a })
	if _, err := p.primary.Append(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := p.primary.WaitAcked(ctx, 1); err != nil {
		t.Fatal(err)
	}

	try := func(cfg Config, epoch uint64) *Primary {
		intruder := NewPrimary(cfg, p.listener.Addr().String(), epoch)
		ictx, icancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer icancel()
		go func() { _ = intruder.Run(ictx) }()
		<-ictx.Done()
		return intruder
	}
	other := pki.New(t, "other-ca")
	for name, intruder := range map[string]*Primary{
		"certificate from another CA": try(Config{Pair: "ns/db", TLS: other.TLSConfig(t, "lockstepd")}, 1),
	} {
		if s := intruder.Stats(); s.Connections != 0 {
			t.Errorf("%s: connected %d times", name, s.Connections)
		}
	}
	// The right CA but another pair, or an older epoch (a fenced primary): refused at Hello.
	before := p.secondary.Stats().Refused
	cfg := Config{Pair: "ns/other", TLS: p.primary.cfg.TLS}
	try(cfg, 1)
	cfg.Pair = "ns/db"
	try(cfg, 0)
	if got := p.secondary.Stats().Refused - before; got < 2 {
		t.Errorf("refused %d intruders, want both", got)
	}
}

func TestTheSecondaryNoticesASilentPrimary(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pctx, stopPrimary := context.WithCancel(ctx)
	cfg := Config{Pair: "ns/db", Heartbeat: 20 * time.Millisecond, Timeout: 150 * time.Millisecond}
	p := startPair(t, pctx, cfg, func(a string) string { return a })
	if _, err := p.primary.Append(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := p.primary.WaitAcked(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// Heartbeats keep a quiet primary alive.
	time.Sleep(3 * cfg.Timeout)
	if d := p.secondary.Silence(time.Now()); d > cfg.Timeout {
		t.Fatalf("a live, quiet primary counted silent for %v", d)
	}
	lost := make(chan time.Duration, 1)
	go p.secondary.WatchSilence(ctx, cfg.Timeout, func(d time.Duration) { lost <- d })
	stopped := time.Now()
	stopPrimary()
	select {
	case d := <-lost:
		t.Logf("primary silent for %v; noticed %v after it stopped (heartbeat %v, timeout %v)", d, time.Since(stopped), cfg.Heartbeat, cfg.Timeout)
	case <-time.After(10 * time.Second):
		t.Fatal("a stopped primary was never noticed")
	}
}

// TestAPrimaryThatResignsTellsTheSecondary: Resign's frame reaches the secondary with its reason,
// and the primary's log ends with it.
func TestAPrimaryThatResignsTellsTheSecondary(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := Config{Pair: "ns/db", Heartbeat: 20 * time.Millisecond, Timeout: time.Second}
	p := startPair(t, ctx, cfg, func(a string) string { return a })
	if _, err := p.primary.Append(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := p.primary.WaitAcked(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if !p.primary.Resign(ctx, "the VM engine stopped: QEMU exited") {
		t.Fatal("Resign says the secondary was not told, on a live connection")
	}
	select {
	case why := <-p.resigned:
		if why != "the VM engine stopped: QEMU exited" {
			t.Fatalf("the secondary was told %q", why)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the secondary never heard that the primary resigned")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := p.primary.Append(ctx, []byte("y"))
		if errors.Is(err, ErrResigned) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log goes on after the primary resigned: Append returned %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestASecondaryHoldsOnlyTheStateOfTheNewestEpoch: a primary that claimed the pair against its
// secondary takes a new epoch and may release outputs the secondary never saw. A secondary that
// only admitted such a primary's Hello holds the older state: it is not Synchronized (it may not
// claim the pair nor be promoted) until it applied that primary's first entry.
func TestASecondaryHoldsOnlyTheStateOfTheNewestEpoch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ca := pki.New(t, "lockstep-ca")
	cfg := Config{Pair: "ns/db", Heartbeat: 20 * time.Millisecond, Timeout: time.Second}
	scfg := cfg
	scfg.TLS = ca.TLSConfig(t, "lockstepd")
	var flips atomic.Int32
	sec := NewSecondary(scfg, func(ftlog.Entry) error { return nil })
	sec.OnSynchronized = func() { flips.Add(1) }
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	wg.Add(1)
	go func() { defer wg.Done(); _ = sec.Serve(ctx, ln) }()
	primaryAt := func(epoch uint64) (*Primary, context.CancelFunc) {
		pcfg := cfg
		pcfg.TLS = ca.TLSConfig(t, "lockstepd")
		p := NewPrimary(pcfg, ln.Addr().String(), epoch)
		pctx, stop := context.WithCancel(ctx)
		wg.Add(1)
		go func() { defer wg.Done(); _ = p.Run(pctx) }()
		return p, stop
	}
	appendAcked := func(p *Primary) {
		t.Helper()
		seq, err := p.Append(ctx, []byte("state"))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.WaitAcked(ctx, seq); err != nil {
			t.Fatal(err)
		}
	}
	if sec.Synchronized() {
		t.Fatal("a secondary that applied nothing says it is synchronized")
	}
	first, stopFirst := primaryAt(1)
	appendAcked(first)
	if !sec.Synchronized() || flips.Load() != 1 {
		t.Fatalf("after the epoch 1 primary's first entry: synchronized %v, OnSynchronized called %d times", sec.Synchronized(), flips.Load())
	}
	stopFirst()
	second, stopSecond := primaryAt(2)
	defer stopSecond()
	deadline := time.Now().Add(10 * time.Second)
	for sec.Epoch() != 2 {
		if time.Now().After(deadline) {
			t.Fatal("the epoch 2 primary was never admitted")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if sec.Synchronized() {
		t.Fatal("the secondary says it is synchronized at epoch 2, having applied nothing its primary logged")
	}
	appendAcked(second)
	if !sec.Synchronized() || flips.Load() != 2 {
		t.Fatalf("after the epoch 2 primary's first entry: synchronized %v, OnSynchronized called %d times", sec.Synchronized(), flips.Load())
	}
}
