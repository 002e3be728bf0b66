package channel

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/ftlog"
	"github.com/lockstep-dev/lockstep/test/pki"
)

// TestTheSecondaryPassesOnItsRenewals: each renewal of the record that the secondary made for
// its primary reaches the primary (ftlog.Renewed), dated no later than it began.
func TestTheSecondaryPassesOnItsRenewals(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ca := pki.New(t, "lockstep-ca")
	cfg := Config{Pair: "ns/db", Heartbeat: 10 * time.Millisecond, Timeout: 300 * time.Millisecond}
	scfg, pcfg := cfg, cfg
	scfg.TLS, pcfg.TLS = ca.TLSConfig(t, "lockstepd"), ca.TLSConfig(t, "lockstepd")
	var witnessed atomic.Int64 // unix nanos of the secondary's last renewal
	s := NewSecondary(scfg, func(ftlog.Entry) error { return nil })
	s.Witness = func() time.Time {
		if n := witnessed.Load(); n != 0 {
			return time.Unix(0, n)
		}
		return time.Time{}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var mu sync.Mutex
	var told []time.Time
	p := NewPrimary(pcfg, ln.Addr().String(), 1)
	p.OnRenewed = func(began time.Time) {
		mu.Lock()
		told = append(told, began)
		mu.Unlock()
	}
	wg.Add(2)
	go func() { defer wg.Done(); _ = s.Serve(ctx, ln) }()
	go func() { defer wg.Done(); _ = p.Run(ctx) }()

	renewedAt := time.Now()
	witnessed.Store(renewedAt.UnixNano())
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(told)
		var first time.Time
		if n > 0 {
			first = told[0]
		}
		mu.Unlock()
		if n > 0 {
			if first.After(renewedAt) {
				t.Fatalf("the primary dates the renewal %s, after it began (%s)", first, renewedAt)
			}
			if renewedAt.Sub(first) > cfg.Timeout+time.Second {
				t.Fatalf("the primary dates the renewal %s before it began: more than the timeout", renewedAt.Sub(first))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the primary never heard of the secondary's renewal")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Told once per renewal, not at every heartbeat.
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	n := len(told)
	mu.Unlock()
	if n != 1 {
		t.Fatalf("one renewal told %d times", n)
	}
}

// TestAPrimaryFallsBackToASecondaryOfVersion1: a secondary of version 1 closes the connection
// on a Hello of version 2; the primary says version 1 from then on, and connects.
func TestAPrimaryFallsBackToASecondaryOfVersion1(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ca := pki.New(t, "lockstep-ca")
	cfg := Config{Pair: "ns/db", Heartbeat: 10 * time.Millisecond, Timeout: 300 * time.Millisecond}
	stc, ptc := ca.TLSConfig(t, "lockstepd"), ca.TLSConfig(t, "lockstepd")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	var versions []uint8
	var mu sync.Mutex
	served := make(chan struct{})
	go func() {
		for {
			raw, err := ln.Accept()
			if err != nil {
				return
			}
			c, hello, stop, err := accept(ctx, raw, stc, time.Second)
			if err != nil {
				_ = raw.Close()
				continue
			}
			mu.Lock()
			versions = append(versions, hello.Version)
			mu.Unlock()
			if hello.Version != 1 { // as version 1 did: "protocol version 2, want 1"
				stop()
				_ = c.Close()
				continue
			}
			_ = c.write(ftlog.Frame{Type: ftlog.FrameHello, Hello: &ftlog.Hello{Version: 1, Role: ftlog.RoleSecondary, Epoch: 1, Next: 1, Pair: cfg.Pair}})
			close(served)
			// Heartbeats of version 1, until the test ends.
			for i := 0; ctx.Err() == nil; i++ {
				if c.write(ftlog.Frame{Type: ftlog.FrameHeartbeat, Heartbeat: &ftlog.Heartbeat{SentUnixNano: time.Now().UnixNano()}}) != nil {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			stop()
			_ = c.Close()
			return
		}
	}()
	pcfg := cfg
	pcfg.TLS = ptc
	p := NewPrimary(pcfg, ln.Addr().String(), 1)
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("the primary never spoke version 1 to a secondary of version 1")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(versions) < 2 || versions[0] != ftlog.Version || versions[len(versions)-1] != 1 {
		t.Fatalf("the primary's Hellos said versions %v, want %d, then 1", versions, ftlog.Version)
	}
	cancel()
	<-done
}
