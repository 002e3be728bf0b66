package channel

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/ftlog"
	"github.com/lockstep-dev/lockstep/test/pki"
)

// TestMuxRoutesByPairAndNewLogsStartOver serves two pairs from one listener, refuses a pair it
// does not serve, and checks that a primary's new log (after a restart, or for a takeover) starts
// the secondary's replica over from its first entry rather than resuming the old one.
func TestMuxRoutesByPairAndNewLogsStartOver(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ca := pki.New(t, "ca")
	cfg := func(pair string) Config {
		return Config{Pair: pair, TLS: ca.TLSConfig(t, "lockstepd"), Heartbeat: 5 * time.Millisecond, Timeout: 100 * time.Millisecond}
	}
	var mu sync.Mutex
	applied := map[string][]uint64{}
	secondary := func(pair string) *Secondary {
		return NewSecondary(cfg(pair), func(e ftlog.Entry) error {
			mu.Lock()
			applied[pair] = append(applied[pair], e.Seq)
			mu.Unlock()
			return nil
		})
	}
	mux := &Mux{TLS: ca.TLSConfig(t, "lockstepd")}
	s1, s2 := secondary("ns/one"), secondary("ns/two")
	mux.Register("ns/one", s1)
	mux.Register("ns/two", s2)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = mux.Serve(ctx, ln) }()

	stream := func(pair string, n int) {
		t.Helper()
		pctx, stop := context.WithCancel(ctx)
		defer stop()
		p := NewPrimary(cfg(pair), ln.Addr().String(), 1)
		go func() { _ = p.Run(pctx) }()
		var last uint64
		for range n {
			if last, err = p.Append(ctx, []byte(pair)); err != nil {
				t.Fatal(err)
			}
		}
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		if err := p.WaitAcked(wctx, last); err != nil {
			t.Fatalf("%s: entry %d not acknowledged: %v", pair, last, err)
		}
	}
	stream("ns/one", 10)
	stream("ns/two", 3)
	stream("ns/one", 4) // a new primary of ns/one: a new log

	mu.Lock()
	defer mu.Unlock()
	want := map[string][]uint64{"ns/one": {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4}, "ns/two": {1, 2, 3}}
	for pair, seqs := range want {
		if len(applied[pair]) != len(seqs) {
			t.Fatalf("%s applied %v, want %v", pair, applied[pair], seqs)
		}
		for i := range seqs {
			if applied[pair][i] != seqs[i] {
				t.Fatalf("%s applied %v, want %v", pair, applied[pair], seqs)
			}
		}
	}
	if st := s1.Stats(); st.Logs != 2 {
		t.Fatalf("ns/one followed %d logs, want 2", st.Logs)
	}

	// A pair this node does not serve is refused.
	p := NewPrimary(cfg("ns/three"), ln.Addr().String(), 1)
	pctx, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	_ = p.Run(pctx)
	if mux.Unknown() == 0 || p.Stats().Connections != 0 {
		t.Fatalf("a primary of an unknown pair was served: unknown %d, connections %d", mux.Unknown(), p.Stats().Connections)
	}
}

// TestOnlyThePairsOtherNodeIsServed: the mux serves a pair's log only to the node it authorizes
// for the pair, and a primary refuses a secondary whose certificate names another node than the
// one it expects, although every certificate is signed by the same CA.
func TestOnlyThePairsOtherNodeIsServed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ca := pki.New(t, "ca")
	mux := &Mux{TLS: ca.TLSConfig(t, "node-b"), Authorize: func(pair, node string) error {
		if node != "node-a" {
			return fmt.Errorf("%s is not the node of %s's primary", node, pair)
		}
		return nil
	}}
	s := NewSecondary(Config{Pair: "ns/vm", TLS: ca.TLSConfig(t, "node-b")}, func(ftlog.Entry) error { return nil })
	mux.Register("ns/vm", s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = mux.Serve(ctx, ln) }()

	// reaches: a primary on node from, expecting the secondary on node expect, gets an entry
	// acknowledged within a second.
	reaches := func(from, expect string) bool {
		pctx, stop := context.WithTimeout(ctx, time.Second)
		defer stop()
		cfg := Config{Pair: "ns/vm", TLS: ca.TLSConfig(t, from), PeerNode: expect, Heartbeat: 5 * time.Millisecond, Timeout: 100 * time.Millisecond}
		p := NewPrimary(cfg, ln.Addr().String(), 1)
		go func() { _ = p.Run(pctx) }()
		seq, err := p.Append(pctx, []byte("x"))
		if err != nil {
			return false
		}
		return p.WaitAcked(pctx, seq) == nil
	}
	if reaches("node-c", "node-b") {
		t.Fatal("a third node's lockstepd was served the pair's log")
	}
	if mux.Refused() == 0 {
		t.Fatal("the mux counted no refusal")
	}
	if reaches("node-a", "node-x") {
		t.Fatal("the primary accepted a secondary of another node than it expects")
	}
	if !reaches("node-a", "node-b") {
		t.Fatal("the pair's own primary was not served")
	}
}
