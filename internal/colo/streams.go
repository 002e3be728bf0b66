package colo

import (
	"context"

	"github.com/lockstep-dev/lockstep/internal/relay"
)

// pairing is the relayed streams of one protection (or, on a secondary, of its pair).
type pairing struct {
	cancel   context.CancelFunc
	counters []*relay.Counters
	names    []string // the stream of each counter
	routes   []string
}

// pairWith relays the pair's streams: forwards for the ones this side's QEMU dials, routes for
// the ones it listens on, until unpair. peer says where the forwards go; cps, when set, reads the
// migration stream's return path.
func (e *Engine) pairWith(peer func() relay.Target, cps *Checkpoints, dials, listens []string) {
	pctx, cancel := context.WithCancel(context.Background())
	p := &pairing{cancel: cancel}
	for _, s := range dials {
		f := &relay.Forward{Stream: s, Path: e.cfg.Sockets.Path(s), Peer: peer, TLS: e.cfg.TLS, Dial: e.cfg.Dial, Owner: e.cfg.Owner,
			// The secondary's packet streams: its filter-redirectors read and write them for one
			// protection, and stop reading for good once a connection closes.
			Once: s == StreamMirror || s == StreamCompare}
		if s == StreamMigration && cps != nil {
			f.FromPeer = cps.Observe
		}
		if err := f.Listen(pctx); err != nil {
			e.cfg.Log.Error(err, "relay")
		}
		p.counters, p.names = append(p.counters, &f.Counters), append(p.names, s)
	}
	for _, s := range listens {
		p.counters, p.names = append(p.counters, e.cfg.Relay.Route(e.cfg.Pair, e.cfg.Member, s, e.cfg.Sockets.Path(s))), append(p.names, s)
		p.routes = append(p.routes, s)
	}
	e.mu.Lock()
	e.streams = p
	e.mu.Unlock()
}

// unpair cuts the relayed streams: QEMU sees them end, as if the peer had died.
func (e *Engine) unpair() {
	e.mu.Lock()
	p := e.streams
	e.streams = nil
	if p != nil {
		for _, c := range p.counters {
			e.bytesDone += c.Sent()
		}
	}
	e.mu.Unlock()
	if p == nil {
		return
	}
	p.cancel()
	for _, s := range p.routes {
		e.cfg.Relay.Unroute(e.cfg.Pair, e.cfg.Member, s)
	}
}

// StreamBytes is, for each stream of the current pairing, the bytes this node carried to the
// peer and from it.
func (e *Engine) StreamBytes() map[string][2]uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string][2]uint64{}
	if e.streams != nil {
		for i, c := range e.streams.counters {
			out[e.streams.names[i]] = [2]uint64{c.Sent(), c.Received()}
		}
	}
	return out
}
