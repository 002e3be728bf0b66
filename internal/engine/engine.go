// Package engine is the contract between lockstepd and a VM replication engine: what an engine
// implements (Engine and its optional capabilities) and what lockstepd gives it (Recorder). It is a
// leaf: engines (internal/colo, the test doubles) import it and nothing above it, and lockstepd
// drives any engine through it.
package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockstep-dev/lockstep/internal/ftlog"
)

// ErrFenced is what an engine returns when its side was fenced: it may not run the VM.
var ErrFenced = errors.New("this side was fenced: it may not run the VM")

// Engine is one member's VM as lockstepd drives it. The QEMU COLO engine (issue 5) and the test
// double in test/vmdouble implement it.
type Engine interface {
	// Run runs the VM as the primary, from its current state, until ctx ends: it logs every
	// nondeterministic input through rec before acting on it, and sends outputs either through
	// rec.Output or out of GateInterface, where the kernel gate holds them.
	Run(ctx context.Context, rec Recorder) error
	// Resync tells a running primary that a new secondary joined: the next entry it logs must
	// carry the whole VM state, so that the secondary can start from it.
	Resync()
	// Apply applies one log entry on the secondary. lockstepd calls it in log order, exactly once
	// per entry, and never after the side went live or was fenced.
	Apply(e ftlog.Entry) error
	// Stop stops the VM for good: the side was fenced. It must not return before the VM can no
	// longer produce output.
	Stop()
	// GateInterface is the interface whose outbound packets the kernel gate holds (the VM's tap),
	// or "" when every output goes through Recorder.Output.
	GateInterface() string
}

// Recorder is what a running primary engine logs and outputs through.
type Recorder interface {
	// Append logs an entry and returns its position; every output produced after it follows it.
	// It waits while the replication window is full (flow control) and while the secondary
	// trails by more than the interval threshold (the paper's slowing of the primary).
	Append(ctx context.Context, data []byte) (uint64, error)
	// Output holds an output until the secondary has acknowledged every entry logged before it,
	// then calls release; outputs are released in the order they were given. An output held when
	// the side is fenced is dropped: release is never called.
	Output(release func())
	// DropSecondary is for an engine that holds the VM's output itself (QEMU COLO's comparison)
	// and can no longer keep its secondary in step while the secondary still answers (the
	// protection broke): before the engine lets that output leave, lockstepd claims the pair
	// from the secondary, as from a silent one, so that the secondary can never go live with the
	// older state. It returns once the claim is decided: nil when this side won it (or already
	// runs alone: its secondary never took the state of its epoch), ErrFenced when it lost it or
	// could not reach the record (the side is fenced: the engine must release nothing).
	DropSecondary(ctx context.Context, why string) error
}

// Unprotector is an Engine that replicates through streams of its own (QEMU COLO) rather than
// through the log alone. The agent calls Unprotect, without blocking, when the primary won the
// pair's Lease against its secondary (the member named; "" when the agent knows none): the engine
// stops replicating to that secondary, if it still does, and runs the VM on alone until the next
// Resync. A protection of another member (the engine may have moved on by the time the call
// comes) is left alone.
type Unprotector interface {
	Unprotect(secondary string)
}

// Starter is an Engine that must attach to its VM before the agent starts the side: the COLO
// engine attaches to a QEMU that the member's launcher started. The agent calls Start until it
// succeeds, reporting each error; an error that wraps ErrFenced means the member can never serve
// (its VM is left from an earlier protection, or runs without the record): the side is fenced.
type Starter interface {
	Start(ctx context.Context) error
}

// Detacher is an Engine that holds resources of its VM's that outlive the agent (a monitor
// connection, relayed streams): the agent calls Detach when it ends without being fenced (the
// member left the node, or lockstepd stops). The VM runs on; a new agent may attach again.
type Detacher interface {
	Detach()
}

// Watcher is an Engine whose VM can die while the agent follows the log as a secondary (a QEMU
// that the kernel killed for its memory, or that crashed): Exited is closed once the VM is gone
// (nil: not attached yet). A secondary without its VM holds nothing to go live with; the agent
// fences it, so that its primary stops waiting on it and goes on alone.
type Watcher interface {
	Exited() <-chan struct{}
}

// PeerSetter is an Engine that reaches the other member's node itself (QEMU COLO's streams): the
// agent gives it the peer whenever the daemon finds it.
type PeerSetter interface {
	SetPeer(p Peer)
}

// Peer is the other member of the pair, as an engine reaches it.
type Peer struct {
	// Member is the peer member's name (its VMI): streams are routed to a member, not a node.
	Member string
	// Node is the peer member's node: its lockstepd's certificate must name it.
	Node string
	// StreamAddr is where the peer's lockstepd relays streams ("" while unknown).
	StreamAddr string
	// ReplicaOf, on a new secondary, names the earlier secondary whose replicas its copies hold
	// (it never went live); "" for blank copies. An engine that tracked what the VM wrote since
	// that secondary's replicas were whole copies only that (an incremental resync).
	ReplicaOf string
}

// StreamReporter is an Engine whose own streams carry the VM's state; their figures replace the
// log's in the status and the metrics while the side runs the VM.
type StreamReporter interface {
	Streams() StreamStats
}

// StreamStats are an engine's replication figures.
type StreamStats struct {
	// Bytes is what the engine's streams carried to the secondary, over the side's life.
	Bytes uint64
	// Interval is how far the secondary trails: the mean time between checkpoints (zero: none).
	Interval time.Duration
	// Checkpoints counts the engine's checkpoints over the side's life, and Forced those that
	// came before the periodic one was due (the engine's comparison of the two sides' outputs
	// asked for them); Pause is how long the VM stands still for one (a moving average).
	Checkpoints, Forced uint64
	Pause               time.Duration
	// CausesKnown says that the engine's comparison counts why it forced checkpoints: OnMismatch
	// for outputs that differed, OnTimeout for a secondary's output that came too late, OnUnparsed
	// for an output it could not compare and held until a checkpoint, OnCrossed for outputs of
	// both sides that each waited for the other's (Forced is their sum); UnparsedHeld counts the
	// outputs held so. Without it Forced is the engine's guess from the checkpoints' intervals.
	CausesKnown                                  bool
	OnMismatch, OnTimeout, OnUnparsed, OnCrossed uint64
	UnparsedHeld                                 uint64
	// Resync is the copy of the disks into a new secondary while it runs (zero otherwise);
	// LastResync is the last one that completed.
	Resync     Resync
	LastResync ResyncDone
	// ProtectError is why the last attempt to protect the VM with its secondary failed ("" once
	// one succeeds); the engine tries again.
	ProtectError string
	// DiskBytes are the sizes of the VM's replicated disks in bytes, in the member's order of
	// them (nil until the engine attached to its VM): a new secondary's must be the same.
	DiskBytes []int64
}

// Resync is how far the copy of a primary's disks into its new secondary has come: Done of
// Total bytes since Started. Total is the engine's estimate, which grows when the guest writes
// where the copy has passed.
type Resync struct {
	Started     time.Time
	Done, Total uint64
}

// ResyncDone is a completed copy of the disks into a secondary: Bytes copied in Took, of the
// whole disks or (Incremental) of what the VM wrote since an earlier secondary's replicas, which
// the new secondary's copies hold, were whole.
type ResyncDone struct {
	Member      string
	Incremental bool
	Bytes       uint64
	Took        time.Duration
	At          time.Time // when it completed
}

// ErrLost is what an Arbiter returns when the other side holds a newer epoch: this side must
// fence itself.
var ErrLost = errors.New("lost the pair's Lease to the other side")

// Arbiter is the pair's record of who may run the VM, with a compare-and-set on its epoch: the
// white paper's atomic test-and-set on shared storage. internal/arbiter implements it on a
// coordination.k8s.io Lease; the tests use test/leasedouble.
type Arbiter interface {
	// Ensure creates the record with this side as holder at epoch 1 if there is none, and
	// returns the current holder.
	Ensure(ctx context.Context) (Holder, error)
	// Claim takes the epoch after known for this side; ErrLost if someone holds a newer one.
	Claim(ctx context.Context, known uint64) (uint64, error)
	// Renew renews the record's term (internal/term) while it names member (a VMI name) at
	// epoch: the side that runs the VM renews its own. ErrLost when the record names another
	// member or another epoch.
	Renew(ctx context.Context, epoch uint64, member string) error
}

// Pauser is an Engine that can pause its VM and run it again: a side whose term lapsed pauses it
// (internal/term), and resumes it once a renewal goes through. Without it the side is fenced.
type Pauser interface {
	// Pause stops the VM's vCPUs; it must not return before the VM can no longer produce output.
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
}

// RenewDecision is the rule every Arbiter applies to a renewal for member at epoch, given the
// record's holder h (the member part of its identity in holderMember): ErrLost unless the record
// still names that member at that epoch.
func RenewDecision(h Holder, holderMember, member string, epoch uint64) error {
	if h.Epoch != epoch || holderMember != member {
		return fmt.Errorf("%w: the record names %q at epoch %d, not %s at %d", ErrLost, h.Identity, h.Epoch, member, epoch)
	}
	return nil
}

// DecideClaim is the rule every Arbiter applies to a claim by identity from epoch known, given
// the record's holder h: the claim writes epoch known+1 when the record is still at known; it
// already went through when identity holds a newer epoch (an earlier try whose answer was lost:
// the claimer must know the newest epoch it holds, or it "wins" an epoch it had); otherwise it is
// lost.
func DecideClaim(h Holder, identity string, known uint64) (epoch uint64, write bool, err error) {
	switch {
	case h.Epoch > known && h.Identity == identity:
		return h.Epoch, false, nil
	case h.Epoch != known:
		return 0, false, fmt.Errorf("%w: epoch %d held by %s, this side knew %d", ErrLost, h.Epoch, h.Identity, known)
	}
	return known + 1, true, nil
}

// Holder is who holds the record, at which epoch.
type Holder struct {
	Identity string
	Epoch    uint64
	// Self: the holder is this side's member (possibly named before its node was known). A new
	// primary may claim only a record that names it or no one: one that names another member
	// means the VM runs, or is to run, there.
	Self bool
}
