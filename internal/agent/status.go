package agent

import (
	"time"

	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/failover"
)

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
	// RenewedAt is when the last renewal of the pair's record by this side as its holder that
	// went through started (zero: none); Lapses counts the times its term lapsed.
	RenewedAt time.Time
	Lapses    int
	// Checkpoints and ForcedCheckpoints count an engine's checkpoints over the side's life
	// (engine.StreamStats); CheckpointPause is how long the VM stands still for one.
	Checkpoints, ForcedCheckpoints uint64
	CheckpointPause                time.Duration
	// CheckpointCausesKnown says that the engine told the forced checkpoints apart: those for
	// outputs that differed (CheckpointsOnMismatch), for a late secondary (CheckpointsOnTimeout),
	// for outputs it could not compare (CheckpointsOnUnparsed), which it held until a checkpoint
	// (UnparsedHeld of them), and for outputs of both sides that each waited for the other's
	// (CheckpointsOnCrossed).
	CheckpointCausesKnown                                                                    bool
	CheckpointsOnMismatch, CheckpointsOnTimeout, CheckpointsOnUnparsed, CheckpointsOnCrossed uint64
	UnparsedHeld                                                                             uint64
	// Resync is the engine's copy of the disks into a new secondary, while it runs; LastResync
	// the last one that completed.
	Resync     engine.Resync
	LastResync engine.ResyncDone
	// DiskBytes are the sizes of the VM's replicated disks, in the member's order of them, on a
	// side that runs the VM and whose engine measures them (engine.StreamStats).
	DiskBytes []int64
}

// Status returns the agent's snapshot.
func (a *Agent) Status() Status {
	a.mu.Lock()
	st := Status{Pair: a.cfg.Pair, Identity: a.cfg.Identity, State: a.side.State, Since: a.since,
		RunsVM: a.engineRun != nil, Epoch: a.epoch, Peer: a.peer, Position: a.pos,
		Failovers: a.failovers, Message: a.fenceWhy, BytesLogged: a.bytesDone, RenewedAt: a.renewedAt, Lapses: a.lapses}
	if a.side.State == failover.Lapsed && a.renewErr != nil {
		st.Message = "the VM is paused: the pair's record could not be renewed within its term: " + a.renewErr.Error()
	}
	oc, sec, kg := a.out, a.sec, a.kgate
	if a.attachErr != nil {
		st.Message = "attaching to the member's VM: " + a.attachErr.Error()
	}
	if a.engineErr != nil {
		st.Message = "the VM engine stopped: " + a.engineErr.Error()
	}
	a.mu.Unlock()
	st.Synced = sec != nil && sec.Synchronized()
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
	if r, ok := a.vm.(engine.StreamReporter); ok && st.RunsVM {
		// The engine's own streams carry the VM's state: they are the log that counts.
		streams := r.Streams()
		st.BytesLogged += streams.Bytes
		if streams.Interval > 0 {
			st.Interval = streams.Interval
		}
		st.Checkpoints, st.ForcedCheckpoints, st.CheckpointPause = streams.Checkpoints, streams.Forced, streams.Pause
		st.CheckpointCausesKnown, st.CheckpointsOnMismatch, st.CheckpointsOnTimeout = streams.CausesKnown, streams.OnMismatch, streams.OnTimeout
		st.CheckpointsOnUnparsed, st.CheckpointsOnCrossed, st.UnparsedHeld = streams.OnUnparsed, streams.OnCrossed, streams.UnparsedHeld
		st.Resync, st.LastResync, st.DiskBytes = streams.Resync, streams.LastResync, streams.DiskBytes
		if streams.ProtectError != "" && st.Message == "" {
			st.Message = "protecting the VM with its secondary failed (retried): " + streams.ProtectError
		}
	}
	return st
}
