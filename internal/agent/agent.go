// Package agent runs one member of a pair on its node: it wires the FT log channel, the output
// commit gate, failure detection and the pair's record (an engine.Arbiter) to the member's VM
// engine, and decides with internal/failover when the side goes live, goes on alone or is fenced.
// It is free of Kubernetes: lockstepd's daemon (internal/lockstepd) finds the members in the API,
// gives each its agent and reports what the agents say.
//
// One job per file: agent.go the loop and the state machine's actions, lease.go the claims on
// the record, primary.go the log to the secondary and the gates, secondary.go following the log
// and detecting silence, status.go the snapshot the daemon reports.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/lockstep-dev/lockstep/internal/channel"
	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/failover"
	"github.com/lockstep-dev/lockstep/internal/ftlog"
	"github.com/lockstep-dev/lockstep/internal/term"
)

// Registrar routes a pair's incoming connections to its secondary (channel.Mux in production).
type Registrar interface {
	Register(pair string, s *channel.Secondary)
	Unregister(pair string, s *channel.Secondary)
}

// Peer is the other member of the pair, as the daemon found it.
type Peer struct {
	VMI, Node string
	// Addr is where the peer's lockstepd listens for the FT log ("" while unknown).
	Addr string
	// StreamAddr is where it relays an engine's own streams (engine.PeerSetter; "" while unknown).
	StreamAddr string
	// ReplicaOf names the earlier secondary whose replicas a new secondary's copies hold
	// (engine.Peer.ReplicaOf).
	ReplicaOf string
}

// Config configures one member's agent.
type Config struct {
	// Pair is "namespace/name" of the FaultTolerantVM; Identity is "<node>/<vmi>".
	Pair, Identity string
	// Primary: the member starts as the primary (it claims the Lease and runs the VM); otherwise
	// it starts as a secondary that waits for the primary's log.
	Primary bool
	Channel channel.Config
	// Dial, when set, opens the primary's connection to its secondary (default: TCP from the
	// node's network namespace).
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// Detect is how long the peer may be silent before this side claims the Lease.
	Detect time.Duration
	// ClaimTimeout is how long this side keeps trying to reach the arbiter before it fences itself.
	ClaimTimeout time.Duration
	// Term is the pair's record's term (term.go; 0: the record is not renewed, and never lapses).
	Term term.Term
	// Pacer, when set, slows the primary while the secondary trails (a copy per channel).
	Pacer *ftlog.Pacer
	// OpenKernelGate opens the kernel backend of the gate for the engine's interface; nil when
	// the engine has none or the node has no kernel gate.
	OpenKernelGate func(ctx context.Context, iface string, position func() uint64) (KernelGate, error)
	// OnChange is called (without blocking) after every change of the side's state.
	OnChange func()
	Log      logr.Logger
}

// KernelGate is the kernel backend of the gate (netgate.Gate on Linux).
type KernelGate interface {
	Ack(pos uint64)
	Fence()
	Held() int
	Close() error
}

// Agent runs one member: one side of one pair.
type Agent struct {
	cfg    Config
	vm     engine.Engine // the member's VM
	arb    engine.Arbiter
	mux    Registrar
	events chan func()
	// stopped is closed once Run has returned: nothing reads events any more.
	stopped chan struct{}

	// appendMu serializes Append with the replacement of the channel, so that a position is
	// computed against the log it was appended to.
	appendMu sync.Mutex

	mu    sync.Mutex
	side  failover.Side
	epoch uint64
	pos   uint64 // output positions: entries logged while this side ran the VM
	out   *outChannel
	sec   *channel.Secondary
	peer  Peer
	// dropped is the secondary this side, as the primary, claimed the pair against: it holds an
	// older state and can never follow again (the operator replaces it), so no log goes to it.
	dropped   string
	claiming  bool
	engineRun context.CancelFunc
	engineErr error
	gates     []outputGate
	pgate     *processGate
	kgate     KernelGate
	since     time.Time // of the current state
	failovers int
	fenceWhy  string
	attachErr error  // why the engine could not attach to its VM yet
	bytesDone uint64 // log bytes of channels already dropped
	// acked is the output position the current secondary acknowledged last, kept while the side
	// may not release it (lapsed) for when it may again.
	acked uint64
	// renewedAt is when the last renewal (or claim) of the record that went through started, on
	// this node's clock; renewTried when the last one started; renewErr how the last one ended.
	renewedAt, renewTried time.Time
	// witnessedAt, on a secondary, is when its last renewal of the record for its primary that
	// went through started.
	witnessedAt time.Time
	renewing    bool
	renewErr    error
	lapses      int
}

// New makes the agent of one member.
func New(cfg Config, vm engine.Engine, arb engine.Arbiter, mux Registrar) *Agent {
	if cfg.Detect <= 0 {
		cfg.Detect = 3 * cfg.Channel.Timeout
	}
	if cfg.ClaimTimeout <= 0 {
		cfg.ClaimTimeout = 5 * time.Second
	}
	a := &Agent{cfg: cfg, vm: vm, arb: arb, mux: mux, events: make(chan func(), 16), stopped: make(chan struct{}), pgate: &processGate{}}
	a.gates = []outputGate{a.pgate}
	if cfg.Primary {
		a.side = failover.Side{State: failover.Claiming, WasPrimary: true}
	} else {
		a.side = failover.NewSecondary()
	}
	a.since = time.Now()
	return a
}

// Run runs the agent until ctx ends or the side is fenced and its VM stopped.
func (a *Agent) Run(ctx context.Context) error {
	defer close(a.stopped)
	defer a.shutdown()
	if !a.attach(ctx) {
		if a.State() == failover.Fenced {
			return engine.ErrFenced
		}
		return ctx.Err()
	}
	if a.cfg.Primary {
		a.startPrimary(ctx)
	} else {
		a.startSecondary(ctx)
	}
	tick := time.NewTicker(max(a.cfg.Detect/8, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev := <-a.events:
			ev()
		case now := <-tick.C:
			a.checkSilence(ctx, now)
			a.checkTerm(ctx, now)
		}
		if a.State() == failover.Fenced {
			return engine.ErrFenced
		}
	}
}

// attach attaches an engine that must find its VM first (engine.Starter), retrying every two
// seconds and reporting why it cannot yet; the agent's events are served meanwhile (the member
// may be fenced while it waits). It reports whether the side may start.
func (a *Agent) attach(ctx context.Context) bool {
	s, ok := a.vm.(engine.Starter)
	if !ok {
		return true
	}
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case ev := <-a.events:
			ev()
			if a.State() == failover.Fenced {
				return false
			}
		case <-retry.C:
			err := s.Start(ctx)
			fenced := errors.Is(err, engine.ErrFenced)
			a.mu.Lock()
			a.attachErr = err
			if fenced {
				a.attachErr = nil // the fence says why
			}
			a.mu.Unlock()
			switch {
			case err == nil:
				a.changed()
				return true
			case fenced:
				a.fence("attaching to the member's VM: " + err.Error())
				return false
			}
			a.cfg.Log.Info("cannot attach to the member's VM yet; retrying", "err", err.Error())
			a.changed()
			retry.Reset(2 * time.Second)
		}
	}
}

// post runs fn on the agent's loop. Once the loop has ended (the side fenced and its VM stopped,
// or the agent stopped) fn is dropped: nothing would run it, and the caller must not wait for
// it. lockstepd tells a fenced member's agent of its peer on every reconcile of the pair until
// the member's VMI is gone; with the loop ended, the seventeenth such call filled the channel and
// held lockstepd's only reconcile worker for good (CI, after an API server outage).
func (a *Agent) post(ctx context.Context, fn func()) {
	select {
	case <-a.stopped:
		return
	default:
	}
	select {
	case a.events <- fn:
	case <-a.stopped:
	case <-ctx.Done():
	}
}

// SetPeer tells the agent where the other member is; a primary without a secondary connects to
// it. A protected primary told of another secondary than the one it streams to claims the pair
// from that one first, as from a secondary that broke, and then protects into the new one: the
// operator makes a new secondary only once it let the old one go (a pair has one at a time), and
// a secondary it let go may run on where its node cannot hear that (cut from the API server), so
// that the VM would rest on a member that is no longer the pair's.
func (a *Agent) SetPeer(ctx context.Context, p Peer) {
	if ps, ok := a.vm.(engine.PeerSetter); ok {
		ps.SetPeer(engine.Peer{Member: p.VMI, Node: p.Node, StreamAddr: p.StreamAddr, ReplicaOf: p.ReplicaOf})
	}
	a.post(ctx, func() {
		a.mu.Lock()
		a.peer = p
		old := ""
		if a.out != nil {
			old = a.out.peer.VMI
		}
		replaced := a.side.State == failover.Protected && old != "" && p.VMI != "" && p.VMI != old
		a.mu.Unlock()
		if replaced {
			a.on(ctx, failover.SecondaryDropped, fmt.Sprintf("the operator replaced secondary %s with %s", old, p.VMI))
			return // a claim won starts the new log (StartSecondary)
		}
		a.connectPeer(ctx)
	})
}

// Promote tells a secondary that the operator made it the primary (the operator saw the
// primary's node lost): a synchronized secondary that has not gone live yet claims the Lease.
func (a *Agent) Promote(ctx context.Context) {
	a.post(ctx, func() {
		if a.State() == failover.Replicating && a.synchronized() {
			a.on(ctx, failover.PeerSilent, "the operator promoted this member")
		}
	})
}

// Fence tells the agent that its member may never run the VM again (the operator fenced it): it
// drops what it holds and stops the VM.
func (a *Agent) Fence(ctx context.Context, why string) {
	if a.State() == failover.Fenced {
		return // already; and its loop may have ended
	}
	a.post(ctx, func() { a.fence(why) })
}

// on feeds the state machine and carries out its actions.
func (a *Agent) on(ctx context.Context, e failover.Event, why string) {
	a.mu.Lock()
	before := a.side.State
	actions, err := a.side.On(e)
	if a.side.State != before {
		a.since = time.Now()
	}
	a.mu.Unlock()
	if err != nil {
		a.cfg.Log.Error(err, "ignored")
		return
	}
	a.cfg.Log.Info("state", "event", e.String(), "from", before.String(), "to", a.State().String(), "why", why)
	for _, act := range actions {
		switch act {
		case failover.Claim:
			a.claimFromPeer(ctx)
		case failover.GoLive:
			a.mu.Lock()
			a.failovers++
			a.mu.Unlock()
		case failover.ReleaseHeld:
			a.mu.Lock()
			pos, running, dropped := a.pos, a.engineRun != nil, a.dropped
			a.mu.Unlock()
			a.ackGates(pos)
			// A running primary won the Lease against its secondary: an engine that replicates
			// through its own streams stops replicating to it.
			if u, ok := a.vm.(engine.Unprotector); ok && running {
				u.Unprotect(dropped)
			}
		case failover.Fence:
			a.fence(why)
		case failover.StartSecondary:
			a.connectPeer(ctx)
		case failover.Pause:
			a.pause(ctx, why)
		case failover.Resume:
			if !a.resume(ctx) {
				return
			}
		case failover.ReleaseAcked:
			a.mu.Lock()
			acked := a.acked
			a.mu.Unlock()
			a.ackGates(acked)
		}
	}
	// A side that won the Lease runs the VM: a new primary starts it, a secondary goes live.
	a.mu.Lock()
	start := a.side.State == failover.Alone && a.engineRun == nil
	a.mu.Unlock()
	if start {
		a.startEngine(ctx)
	}
	a.changed()
}

// fence drops every held output, refuses new ones and stops the VM.
func (a *Agent) fence(why string) {
	a.mu.Lock()
	protected := a.side.State == failover.Protected
	if a.side.State != failover.Fenced {
		a.side.State = failover.Fenced
		a.since = time.Now()
	}
	a.fenceWhy = why
	gates, stop, sec, out := a.gates, a.engineRun, a.sec, a.out
	a.mu.Unlock()
	for _, g := range gates {
		g.Fence()
	}
	// With its outputs fenced, a protected primary tells its secondary that it resigned, so that
	// the secondary claims the pair now rather than after its detection timeout. (A side that
	// was claiming has a silent peer: there is no one to tell.)
	if protected && out != nil && out.p.Resign(context.Background(), why) {
		a.cfg.Log.Info("told the secondary that this side resigned")
	}
	if sec != nil {
		sec.Close()
		a.mux.Unregister(a.cfg.Pair, sec)
	}
	a.dropChannel()
	if stop != nil {
		stop()
	}
	a.vm.Stop()
	a.cfg.Log.Info("fenced", "why", why)
	a.changed()
}

// shutdown stops everything when the agent ends (the member left the node, or lockstepd stops).
func (a *Agent) shutdown() {
	a.dropChannel()
	a.mu.Lock()
	sec, stop, kg := a.sec, a.engineRun, a.kgate
	a.mu.Unlock()
	if sec != nil {
		sec.Close()
		a.mux.Unregister(a.cfg.Pair, sec)
	}
	if stop != nil {
		stop()
	}
	if kg != nil {
		_ = kg.Close()
	}
	if d, ok := a.vm.(engine.Detacher); ok {
		d.Detach()
	}
}

func (a *Agent) changed() {
	if a.cfg.OnChange != nil {
		a.cfg.OnChange()
	}
}
