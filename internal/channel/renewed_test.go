package channel

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/ftlog"
)

// renewalPairConfigs are the renewal tests' channel configuration, and its secondary's and its
// primary's (withPairCerts).
func renewalPairConfigs(t *testing.T) (cfg, secondary, primary Config) {
	cfg = Config{Pair: "ns/db", Heartbeat: 10 * time.Millisecond, Timeout: 300 * time.Millisecond}
	secondary, primary = withPairCerts(t, cfg)
	return cfg, secondary, primary
}

// TestTheSecondaryPassesOnItsRenewals: each renewal of the record that the secondary made for
// its primary reaches the primary (ftlog.Renewed), dated no later than it began.
func TestTheSecondaryPassesOnItsRenewals(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, scfg, pcfg := renewalPairConfigs(t)
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

// TestAPrimarySpeaksVersion1ToASecondaryOfVersion1: a secondary of version 1 names no TLS
// application protocol, and closes the connection on a Hello of any other version than 1; the
// primary's first Hello to it says version 1.
func TestAPrimarySpeaksVersion1ToASecondaryOfVersion1(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, scfg, pcfg := renewalPairConfigs(t)
	stc := scfg.TLS
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
			// As version 1 served: TLS without an application protocol.
			c, stop, err := handshake(ctx, tls.Server(raw, ServerTLS(stc)), time.Second)
			if err != nil {
				_ = raw.Close()
				continue
			}
			f, err := c.read(time.Second)
			if err != nil || f.Type != ftlog.FrameHello {
				stop()
				continue
			}
			mu.Lock()
			versions = append(versions, f.Hello.Version)
			mu.Unlock()
			if f.Hello.Version != 1 { // as version 1 did: "protocol version 2, want 1"
				stop()
				continue
			}
			_ = c.write(ftlog.Frame{Type: ftlog.FrameHello, Hello: &ftlog.Hello{Version: 1, Role: ftlog.RoleSecondary, Epoch: 1, Next: 1, Pair: cfg.Pair}})
			close(served)
			// Heartbeats of version 1, until the test ends.
			for ctx.Err() == nil {
				if c.write(ftlog.Frame{Type: ftlog.FrameHeartbeat, Heartbeat: &ftlog.Heartbeat{SentUnixNano: time.Now().UnixNano()}}) != nil {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			stop()
			return
		}
	}()
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
	if len(versions) != 1 || versions[0] != 1 {
		t.Fatalf("the primary's Hellos said versions %v, want only 1", versions)
	}
	cancel()
	<-done
}

// TestAPrimaryKeepsVersion2AfterASecondaryThatDidNotServeItsPairYet: a primary that connects
// before its secondary is registered on its node's mux sees its connections closed; once the
// secondary is there, they speak version 2, and the secondary's renewals reach the primary. (A
// primary that took each close for a secondary of version 1 spoke version 1 for good, and its
// secondary's renewals never reached it: cut from the API server, it paused though its secondary
// renewed for it.)
func TestAPrimaryKeepsVersion2AfterASecondaryThatDidNotServeItsPairYet(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, scfg, pcfg := renewalPairConfigs(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := &Mux{TLS: scfg.TLS, Timeout: time.Second}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var told atomic.Int32
	p := NewPrimary(pcfg, ln.Addr().String(), 1)
	p.OnRenewed = func(time.Time) { told.Add(1) }
	wg.Add(2)
	go func() { defer wg.Done(); _ = mux.Serve(ctx, ln) }()
	go func() { defer wg.Done(); _ = p.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for mux.Unknown() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the primary did not try the mux before its secondary was there")
		}
		time.Sleep(5 * time.Millisecond)
	}
	s := NewSecondary(scfg, func(ftlog.Entry) error { return nil })
	renewed := time.Now()
	s.Witness = func() time.Time { return renewed }
	mux.Register(cfg.Pair, s)
	for told.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the secondary's renewal never reached the primary: they do not speak version 2")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
