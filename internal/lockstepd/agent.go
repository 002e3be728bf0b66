// Package lockstepd is the node daemon: for every FT member on its node it runs an agent that
// wires the FT log channel, the output commit gate, failure detection and the pair's Lease to the
// member's VM engine (agent.go, Kubernetes-free), and the daemon (daemon.go) that finds the
// node's members in the API, reports to the FaultTolerantVM status and serves metrics and probes.
package lockstepd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/lockstep-dev/lockstep/internal/arbiter"
	"github.com/lockstep-dev/lockstep/internal/channel"
	"github.com/lockstep-dev/lockstep/internal/failover"
	"github.com/lockstep-dev/lockstep/internal/ftlog"
)

// Arbiter is the pair's Lease (internal/arbiter in production).
type Arbiter interface {
	Ensure(ctx context.Context) (arbiter.Holder, error)
	Claim(ctx context.Context, known uint64) (uint64, error)
}

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
}

// AgentConfig configures one member's agent.
type AgentConfig struct {
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
	cfg    AgentConfig
	engine Engine
	arb    Arbiter
	mux    Registrar
	events chan func()

	// appendMu serializes Append with the replacement of the channel, so that a position is
	// computed against the log it was appended to.
	appendMu sync.Mutex

	mu        sync.Mutex
	side      failover.Side
	epoch     uint64
	pos       uint64 // output positions: entries logged while this side ran the VM
	out       *outChannel
	sec       *channel.Secondary
	synced    bool
	peer      Peer
	claiming  bool
	engineRun context.CancelFunc
	engineErr error
	gates     []outputGate
	pgate     *processGate
	kgate     KernelGate
	since     time.Time // of the current state
	failovers int
	fenceWhy  string
	bytesDone uint64 // log bytes of channels already dropped
}

// outChannel is the primary's current channel to a secondary, with its log's base position.
type outChannel struct {
	p      *channel.Primary
	peer   Peer
	base   uint64
	cancel context.CancelFunc
	joined bool
}

// NewAgent makes the agent of one member.
func NewAgent(cfg AgentConfig, engine Engine, arb Arbiter, mux Registrar) *Agent {
	if cfg.Detect <= 0 {
		cfg.Detect = 3 * cfg.Channel.Timeout
	}
	if cfg.ClaimTimeout <= 0 {
		cfg.ClaimTimeout = 5 * time.Second
	}
	a := &Agent{cfg: cfg, engine: engine, arb: arb, mux: mux, events: make(chan func(), 16), pgate: &processGate{}}
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
	defer a.shutdown()
	if a.cfg.Primary {
		a.startPrimary(ctx)
	} else {
		a.startSecondary()
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
		}
		if a.State() == failover.Fenced {
			return ErrFenced
		}
	}
}

// post runs fn on the agent's loop.
func (a *Agent) post(ctx context.Context, fn func()) {
	select {
	case a.events <- fn:
	case <-ctx.Done():
	}
}

// SetPeer tells the agent where the other member is; a primary without a secondary connects to it.
func (a *Agent) SetPeer(ctx context.Context, p Peer) {
	a.post(ctx, func() {
		a.mu.Lock()
		a.peer = p
		a.mu.Unlock()
		a.connectPeer(ctx)
	})
}

// Promote tells a secondary that the operator made it the primary (the operator saw the
// primary's node lost): a synchronized secondary that has not gone live yet claims the Lease.
func (a *Agent) Promote(ctx context.Context) {
	a.post(ctx, func() {
		a.mu.Lock()
		ok := a.side.State == failover.Replicating && a.synced
		a.mu.Unlock()
		if ok {
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

func (a *Agent) startPrimary(ctx context.Context) {
	holder, err := a.arb.Ensure(ctx)
	if err != nil {
		a.fence(fmt.Sprintf("could not read the pair's Lease: %v", err))
		return
	}
	// A new primary always takes a new epoch: an older primary of the pair, if any still runs,
	// is fenced by it.
	a.claim(ctx, holder.Epoch)
}

func (a *Agent) startSecondary() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sec = channel.NewSecondary(a.cfg.Channel, a.apply)
	a.mux.Register(a.cfg.Pair, a.sec)
}

// apply applies an entry on the secondary; the first one makes it synchronized.
func (a *Agent) apply(e ftlog.Entry) error {
	if err := a.engine.Apply(e); err != nil {
		return err
	}
	a.mu.Lock()
	first := !a.synced
	a.synced = true
	a.mu.Unlock()
	if first {
		a.changed()
	}
	return nil
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
			pos, running := a.pos, a.engineRun != nil
			a.mu.Unlock()
			a.ackGates(pos)
			// A running primary won the Lease after its secondary went silent: an engine that
			// replicates through its own streams stops replicating to it.
			if u, ok := a.engine.(Unprotector); ok && running {
				u.Unprotect()
			}
		case failover.Fence:
			a.fence(why)
		case failover.StartSecondary:
			a.connectPeer(ctx)
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

// claimFromPeer stops following or streaming to the silent peer and claims the epoch this side
// knows.
func (a *Agent) claimFromPeer(ctx context.Context) {
	a.mu.Lock()
	known, sec := a.epoch, a.sec
	a.mu.Unlock()
	if sec != nil {
		// Apply nothing more: this side may go live from what it has. Close waits for an entry
		// being applied, whose apply takes a.mu: it must not be held here.
		sec.Close()
		a.mux.Unregister(a.cfg.Pair, sec)
		known = sec.Epoch()
	}
	a.dropChannel()
	a.claim(ctx, known)
}

// claim asks the arbiter for the epoch after known, retrying until ClaimTimeout, and feeds the
// answer to the loop.
func (a *Agent) claim(ctx context.Context, known uint64) {
	a.mu.Lock()
	if a.claiming {
		a.mu.Unlock()
		return
	}
	a.claiming = true
	a.mu.Unlock()
	go func() {
		epoch, err := claimWithin(ctx, a.arb, known, a.cfg.ClaimTimeout)
		a.post(ctx, func() {
			a.mu.Lock()
			a.claiming = false
			if err == nil {
				a.epoch = epoch
			}
			a.mu.Unlock()
			switch {
			case err == nil:
				a.on(ctx, failover.ClaimWon, fmt.Sprintf("won the pair's Lease at epoch %d", epoch))
			case errors.Is(err, arbiter.ErrLost):
				a.on(ctx, failover.ClaimLost, err.Error())
			default:
				a.on(ctx, failover.ClaimFailed, fmt.Sprintf("could not reach the arbiter within %s: %v", a.cfg.ClaimTimeout, err))
			}
		})
	}()
}

func claimWithin(ctx context.Context, arb Arbiter, known uint64, timeout time.Duration) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		epoch, err := arb.Claim(ctx, known)
		if err == nil || errors.Is(err, arbiter.ErrLost) {
			return epoch, err
		}
		select {
		case <-ctx.Done():
			return 0, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startEngine runs the engine as the primary (from the state it applied, on a secondary that goes
// live), with the kernel gate when it has an interface.
func (a *Agent) startEngine(ctx context.Context) {
	if iface := a.engine.GateInterface(); iface != "" && a.cfg.OpenKernelGate != nil {
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
		err := a.engine.Run(ectx, a)
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

// connectPeer starts a new log to the peer when this side runs the VM without a secondary.
func (a *Agent) connectPeer(ctx context.Context) {
	a.mu.Lock()
	alone := a.side.State == failover.Alone
	peer, cur := a.peer, a.out
	a.mu.Unlock()
	if !alone || peer.VMI == "" || peer.Addr == "" || (cur != nil && cur.peer == peer) {
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
	p := channel.NewPrimary(a.cfg.Channel, peer.Addr, a.epoch)
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
	a.engine.Resync()
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
	if a.out != oc || !a.side.MayReleaseAcked() {
		a.mu.Unlock()
		return
	}
	pos := oc.base + seq
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

// checkSilence is the failure detector: a protected primary or a synchronized secondary that has
// not heard its peer for Detect claims the Lease.
func (a *Agent) checkSilence(ctx context.Context, now time.Time) {
	a.mu.Lock()
	state, sec, out, synced := a.side.State, a.sec, a.out, a.synced
	a.mu.Unlock()
	var silence time.Duration
	switch {
	case state == failover.Protected && out != nil:
		silence = now.Sub(out.p.Stats().LastHeard)
	case state == failover.Replicating && synced && sec != nil:
		silence = sec.Silence(now)
	default:
		return
	}
	if silence > a.cfg.Detect {
		a.on(ctx, failover.PeerSilent, fmt.Sprintf("the peer was silent for %s", silence.Round(time.Millisecond)))
	}
}

// fence drops every held output, refuses new ones and stops the VM.
func (a *Agent) fence(why string) {
	a.mu.Lock()
	if a.side.State != failover.Fenced {
		a.side.State = failover.Fenced
		a.since = time.Now()
	}
	a.fenceWhy = why
	gates, stop, sec := a.gates, a.engineRun, a.sec
	a.mu.Unlock()
	for _, g := range gates {
		g.Fence()
	}
	if sec != nil {
		sec.Close()
		a.mux.Unregister(a.cfg.Pair, sec)
	}
	a.dropChannel()
	if stop != nil {
		stop()
	}
	a.engine.Stop()
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

func (a *Agent) changed() {
	if a.cfg.OnChange != nil {
		a.cfg.OnChange()
	}
}

// Append implements Recorder.
func (a *Agent) Append(ctx context.Context, data []byte) (uint64, error) {
	a.appendMu.Lock()
	defer a.appendMu.Unlock()
	a.mu.Lock()
	state, oc := a.side.State, a.out
	a.mu.Unlock()
	if state == failover.Fenced {
		return 0, ErrFenced
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

// Output implements Recorder.
func (a *Agent) Output(release func()) {
	a.pgate.Hold(a.position(), release)
}

// State is the side's state.
func (a *Agent) State() failover.State {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.side.State
}

// Status is a snapshot of the agent, for the FaultTolerantVM status and the metrics.
type Status struct {
	Pair, Identity string
	State          failover.State
	// Since is when the side entered State.
	Since time.Time
	// RunsVM: the side runs the VM (a primary, or a secondary that went live).
	RunsVM    bool
	Epoch     uint64
	Synced    bool
	Peer      Peer
	Connected bool
	// LastHeard is when the peer was last heard (zero: never).
	LastHeard time.Time
	Interval  time.Duration
	PaceDelay time.Duration
	// BytesLogged counts log entry bytes sent (primary) over the agent's life.
	BytesLogged uint64
	// Position is the last output position; Applied the secondary's last applied entry.
	Position, Applied uint64
	Held              int
	Failovers         int
	Message           string
}

// Status returns the agent's snapshot.
func (a *Agent) Status() Status {
	a.mu.Lock()
	st := Status{Pair: a.cfg.Pair, Identity: a.cfg.Identity, State: a.side.State, Since: a.since,
		RunsVM: a.engineRun != nil, Epoch: a.epoch, Synced: a.synced, Peer: a.peer, Position: a.pos,
		Failovers: a.failovers, Message: a.fenceWhy, BytesLogged: a.bytesDone}
	oc, sec, kg := a.out, a.sec, a.kgate
	if a.engineErr != nil {
		st.Message = "the VM engine stopped: " + a.engineErr.Error()
	}
	a.mu.Unlock()
	st.Held = a.pgate.Held()
	if kg != nil {
		st.Held += kg.Held()
	}
	switch {
	case oc != nil:
		ps := oc.p.Stats()
		st.Connected, st.LastHeard, st.Interval, st.PaceDelay = ps.Connected, ps.LastHeard, ps.Interval, ps.PaceDelay
		st.BytesLogged += ps.BytesLogged
	case sec != nil && !st.RunsVM:
		ss := sec.Stats()
		st.Connected, st.LastHeard, st.Applied = ss.Connected, ss.LastHeard, ss.Applied
		if e := sec.Epoch(); e > st.Epoch {
			st.Epoch = e
		}
		if ss.Connections == 0 {
			st.LastHeard = time.Time{}
		}
	}
	if r, ok := a.engine.(StreamReporter); ok && st.RunsVM {
		// The engine's own streams carry the VM's state: they are the log that counts.
		streams := r.Streams()
		st.BytesLogged += streams.Bytes
		if streams.Interval > 0 {
			st.Interval = streams.Interval
		}
	}
	return st
}
