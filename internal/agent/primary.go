package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/lockstep-dev/lockstep/internal/channel"
	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/failover"
)

// outChannel is the primary's current channel to a secondary, with its log's base position.
type outChannel struct {
	p      *channel.Primary
	peer   Peer
	base   uint64
	cancel context.CancelFunc
	joined bool
}

// startEngine runs the engine as the primary (from the state it applied, on a secondary that goes
// live), with the kernel gate when it has an interface.
func (a *Agent) startEngine(ctx context.Context) {
	if iface := a.vm.GateInterface(); iface != "" && a.cfg.OpenKernelGate != nil {
		kg, err := a.cfg.OpenKernelGate(ctx, iface, a.position)
		if err != nil {
			// Without its gate the VM's packets would leave unacknowledged (or not at all).
			a.fence(fmt.Sprintf("could not open the kernel gate on %s: %v", iface, err))
			return
		}
		a.mu.Lock()
		a.kgate = kg
		a.gates = append(a.gates, kg)
		a.mu.Unlock()
	}
	ectx, cancel := context.WithCancel(ctx)
	a.mu.Lock()
	a.engineRun = cancel
	a.mu.Unlock()
	// A side that is Alone releases what it logs at once.
	a.ackGates(a.position())
	go func() {
		err := a.vm.Run(ectx, a)
		if err != nil && ectx.Err() == nil {
			a.mu.Lock()
			a.engineErr = err
			a.mu.Unlock()
			a.cfg.Log.Error(err, "the VM engine stopped")
			// A side whose VM died can serve nothing: it fences itself, so that it stops
			// answering its peer and a synchronized secondary takes over.
			a.post(ctx, func() { a.fence("the VM engine stopped: " + err.Error()) })
		}
	}()
}

// connectPeer starts a new log to the peer when this side runs the VM without a secondary (and
// the peer is not the secondary it claimed the pair against).
func (a *Agent) connectPeer(ctx context.Context) {
	a.mu.Lock()
	alone := a.side.State == failover.Alone
	peer, cur, dropped := a.peer, a.out, a.dropped
	a.mu.Unlock()
	if !alone || peer.VMI == "" || peer.Addr == "" || peer.VMI == dropped || (cur != nil && cur.peer == peer) {
		return
	}
	a.dropChannel()
	a.startChannel(ctx, peer)
}

// startChannel starts a new log to peer. Its first entry is the whole state (Engine.Resync):
// every output held so far follows it, so its acknowledgement releases them all.
func (a *Agent) startChannel(ctx context.Context, peer Peer) {
	a.appendMu.Lock()
	defer a.appendMu.Unlock()
	a.mu.Lock()
	cfg := a.cfg.Channel
	cfg.PeerNode = peer.Node // the secondary's lockstepd must be the node the API names
	p := channel.NewPrimary(cfg, peer.Addr, a.epoch)
	if a.cfg.Dial != nil {
		p.Dial = a.cfg.Dial
	}
	if a.cfg.Pacer != nil {
		pc := *a.cfg.Pacer
		p.Pacer = &pc
	}
	cctx, cancel := context.WithCancel(ctx)
	oc := &outChannel{p: p, peer: peer, base: a.pos, cancel: cancel}
	a.out = oc
	a.mu.Unlock()
	p.OnAck = func(seq uint64) { a.onAck(ctx, oc, seq) }
	p.OnRenewed = func(began time.Time) { a.renewedBySecondary(oc, began) }
	a.vm.Resync()
	go func() {
		err := p.Run(cctx)
		if cctx.Err() != nil {
			return
		}
		// The secondary lost entries it had acknowledged (it restarted): start a new log.
		a.cfg.Log.Info("the log to the secondary cannot go on; starting a new one", "peer", peer.VMI, "err", err)
		a.post(ctx, func() {
			a.mu.Lock()
			current := a.out == oc
			a.mu.Unlock()
			if current {
				a.dropChannel()
				a.startChannel(ctx, peer)
			}
		})
	}()
}

// onAck releases what the acknowledgement covers; the first one means the secondary joined.
func (a *Agent) onAck(ctx context.Context, oc *outChannel, seq uint64) {
	a.mu.Lock()
	if a.out != oc {
		a.mu.Unlock()
		return
	}
	pos := oc.base + seq
	a.acked = max(a.acked, pos)
	if !a.side.MayReleaseAcked() {
		a.mu.Unlock()
		return
	}
	first := !oc.joined
	oc.joined = true
	a.mu.Unlock()
	a.ackGates(pos)
	if first {
		a.post(ctx, func() {
			a.mu.Lock()
			ok := a.out == oc && a.side.State == failover.Alone
			a.mu.Unlock()
			if ok {
				a.on(ctx, failover.SecondaryJoined, "the secondary "+oc.peer.VMI+" acknowledged the VM's state")
			}
		})
	}
}

func (a *Agent) dropChannel() {
	a.mu.Lock()
	oc := a.out
	a.out = nil
	if oc != nil {
		a.bytesDone += oc.p.Stats().BytesLogged
	}
	a.mu.Unlock()
	if oc != nil {
		oc.cancel()
	}
}

func (a *Agent) ackGates(pos uint64) {
	a.mu.Lock()
	gates := a.gates
	a.mu.Unlock()
	for _, g := range gates {
		g.Ack(pos)
	}
}

func (a *Agent) position() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pos
}

// Append implements engine.Recorder.
func (a *Agent) Append(ctx context.Context, data []byte) (uint64, error) {
	a.appendMu.Lock()
	defer a.appendMu.Unlock()
	a.mu.Lock()
	state, oc := a.side.State, a.out
	a.mu.Unlock()
	if state == failover.Fenced {
		return 0, engine.ErrFenced
	}
	if oc != nil {
		// Waits while the window is full; fails once the channel stopped (dropped, or its log
		// could not go on).
		seq, err := oc.p.Append(ctx, data)
		if err == nil {
			return a.logged(oc.base + seq), nil
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		// The entry goes nowhere: the VM state reaches the next secondary through its first entry.
	}
	// No secondary to log to: Alone (released at once) or Claiming (held until the claim is
	// decided).
	a.mu.Lock()
	pos := a.pos + 1
	a.mu.Unlock()
	return a.logged(pos), nil
}

// logged records pos as the last output position; a side that is Alone releases up to it.
func (a *Agent) logged(pos uint64) uint64 {
	a.mu.Lock()
	a.pos = pos
	alone := a.side.State == failover.Alone
	a.mu.Unlock()
	if alone {
		a.ackGates(pos)
	}
	return pos
}

// Output implements engine.Recorder.
func (a *Agent) Output(release func()) {
	a.pgate.Hold(a.position(), release)
}
