package colo

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/ftlog"
	"github.com/lockstep-dev/lockstep/internal/qmp"
	"github.com/lockstep-dev/lockstep/internal/relay"
)

// EngineConfig configures one member's COLO engine.
type EngineConfig struct {
	// Pair names the FaultTolerantVM ("namespace/name") and Member this member (its VMI): the
	// relay routes a stream by the pair and the member that receives it.
	Pair, Member string
	// Primary: the member runs the VM; otherwise it is a secondary that waits for COLO.
	Primary bool
	// Sockets is the member's directory, shared by its launcher and lockstepd: lockstepd's QMP
	// monitor (Sockets.QMP) and the stream sockets.
	Sockets Sockets
	// Owner, when set, is the user the member's QEMU runs as: the stream sockets lockstepd makes
	// for QEMU to connect to are given to it (nil: QEMU runs as lockstepd's user).
	Owner *relay.Owner
	// Tuning is how the primary checkpoints.
	Tuning
	// Relay is the node's stream server; TLS and Dial reach the peer node's.
	Relay *relay.Server
	TLS   *tls.Config
	Dial  func(ctx context.Context, addr string) (net.Conn, error)
	// AttachNetwork, when set, attaches the VM's network to this node when a secondary goes live
	// (a test's switch). The engine then announces the VM's address (QMP announce-self), so that
	// the switches of an L2 network learn its new port.
	AttachNetwork func(ctx context.Context) error
	// OnCheckpoint, when set, sees every checkpoint of a pair this member is the primary of.
	OnCheckpoint func(Checkpoint)
	Log          logr.Logger
}

// Engine is lockstepd's Engine for QEMU COLO. QEMU replicates the VM itself (checkpoints on the
// migration stream, disk writes over NBD, packets compared by colo-compare, which holds the
// primary's output until the two sides agree or a checkpoint reached the secondary), over
// streams that lockstepd's relay carries between the nodes. The agent keeps what COLO lacks:
// failure detection, the pair's Lease, and the decision to go live, to go on alone, or to fence.
// Its log carries one entry when the secondary entered COLO and one per checkpoint.
//
// The engine never launches QEMU: it attaches (attach.go) to the member's QEMU through the
// monitor the launcher gave it in the member's directory, and finds out what an earlier lockstepd
// left there. protect.go protects a running VM with a secondary; streams.go relays the streams.
type Engine struct {
	cfg  EngineConfig
	kick chan struct{}
	cps  chan Checkpoint

	mu         sync.Mutex
	peer       engine.Peer
	protecting context.CancelFunc // ends the protection in progress
	q          *qmp.Conn
	pid        int     // QEMU's, as this process sees it (0: not visible)
	replicated int     // the VM's replicated disks, found in QEMU when the engine attached
	diskBytes  []int64 // their sizes
	leftover   bool    // a primary attached to a QEMU still in COLO from an earlier lockstepd
	// live: runs the VM (the primary, or a secondary that went live). A primary that is not live
	// is a secondary whose go-live an earlier lockstepd began (it won the record) and did not finish.
	live         bool
	wasSecondary bool // keeps the filter-rewriter of its secondary days
	resync       uint64
	resynced     uint64
	// unprotect: the agent won the pair against unprotectFrom ("" for whichever secondary).
	unprotect     bool
	unprotectFrom string
	protected     bool
	// protectedPeer is the last member a protection migrated the VM into: it holds (or held)
	// the VM's state, and cannot take it again.
	protectedPeer string
	streams       *pairing
	bytesDone     uint64
	interval      ftlog.Interval // moving average of the checkpoint intervals
	pause         ftlog.Interval // moving average of the checkpoint pauses
	checkpoints   uint64         // over the engine's life
	forced        uint64         // checkpoints colo-compare asked for before the periodic one
	causes        causeCounts    // the forced ones by the cause colo-compare gave, when it does
	copying       engine.Resync  // the disks' resync into the secondary, while it runs
	lastResync    engine.ResyncDone
	// tracked is the secondary whose replicas replicaBitmap counts from: the last one resynced.
	tracked    string
	watchEvery time.Duration // how often Run checks that the protection holds
	// monitorTimeout bounds each of those checks: a protected primary whose QEMU does not answer
	// for that long, twice in a row, is stuck (see watchProtection).
	monitorTimeout time.Duration
	// lastCheckpoint is when the current protection began or last checkpointed.
	lastCheckpoint time.Time
	protectErr     string // why the last protection failed, until one succeeds
	// paused: the agent paused the VM (its record's term lapsed); no protection starts meanwhile,
	// since COLO's migration would run the VM again.
	paused bool
}

// NewEngine makes a member's engine; Start attaches it to its QEMU.
func NewEngine(cfg EngineConfig) *Engine {
	if cfg.Checkpoint <= 0 {
		cfg.Checkpoint = 2 * time.Second
	}
	if cfg.CompareTimeout <= 0 {
		cfg.CompareTimeout = 3 * time.Second
	}
	return &Engine{cfg: cfg, kick: make(chan struct{}, 1), cps: make(chan Checkpoint, 256), live: cfg.Primary, watchEvery: 5 * time.Second, monitorTimeout: 15 * time.Second,
		interval: ftlog.Interval{Alpha: 1.0 / 8}, pause: ftlog.Interval{Alpha: 1.0 / 8}}
}

var _ interface {
	engine.Engine
	engine.Starter
	engine.Detacher
	engine.PeerSetter
	engine.Unprotector
	engine.StreamReporter
	engine.Pauser
} = (*Engine)(nil)

// SetPeer implements engine.PeerSetter: the peer member, where a secondary's packet streams go,
// and where the next protection's streams go.
func (e *Engine) SetPeer(p engine.Peer) {
	e.mu.Lock()
	changed := e.peer != p
	e.peer = p
	stop := e.protecting
	e.mu.Unlock()
	if changed && stop != nil {
		stop()
	}
}

// peerStreams is where this member's streams go: the peer member on its node.
func (e *Engine) peerStreams() relay.Target {
	e.mu.Lock()
	defer e.mu.Unlock()
	return target(e.cfg.Pair, e.peer)
}

// target is where the streams to the pair's member p go.
func target(pair string, p engine.Peer) relay.Target {
	return relay.Target{Addr: p.StreamAddr, Node: p.Node, Key: relay.Key(pair, p.Member)}
}

// disks is how many replicated disks the VM has.
func (e *Engine) disks() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.replicated
}

func (e *Engine) conn() *qmp.Conn {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.q
}

// entry is what the engine logs: the secondary entered COLO ("ready"), or a checkpoint ended.
type entry struct {
	Kind       string        `json:"kind"`
	Checkpoint uint64        `json:"checkpoint,omitempty"`
	Pause      time.Duration `json:"pause,omitempty"`
}

// Apply implements engine.Engine: the secondary checks that it is in COLO when the primary
// says so. (The VM's state itself arrives on the migration stream.)
func (e *Engine) Apply(le ftlog.Entry) error {
	var en entry
	if err := json.Unmarshal(le.Data, &en); err != nil {
		return fmt.Errorf("COLO log entry %d: %w", le.Seq, err)
	}
	if en.Kind != "ready" {
		return nil
	}
	q := e.conn()
	if q == nil {
		return errors.New("the secondary's QEMU is not attached")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return WaitMode(ctx, q, "secondary")
}

// Exited implements engine.Watcher: QEMU's monitor closes when QEMU exits.
func (e *Engine) Exited() <-chan struct{} {
	if q := e.conn(); q != nil {
		return q.Done()
	}
	return nil
}

// Resync implements engine.Engine: protect the VM with the agent's new secondary.
func (e *Engine) Resync() {
	e.mu.Lock()
	e.resync++
	e.mu.Unlock()
	e.poke()
}

// Unprotect implements engine.Unprotector.
func (e *Engine) Unprotect(secondary string) {
	e.mu.Lock()
	e.unprotect, e.unprotectFrom = true, secondary
	e.mu.Unlock()
	e.poke()
}

func (e *Engine) poke() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// GateInterface implements engine.Engine: colo-compare is the output commit gate of a COLO
// pair, inside QEMU; lockstepd's kernel gate stays out of its way.
func (e *Engine) GateInterface() string { return "" }

// Streams implements engine.StreamReporter.
func (e *Engine) Streams() engine.StreamStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := engine.StreamStats{Bytes: e.bytesDone, Interval: e.interval.Value(), Checkpoints: e.checkpoints, Forced: e.forced, Pause: e.pause.Value(), Resync: e.copying, LastResync: e.lastResync, ProtectError: e.protectErr,
		DiskBytes: e.diskBytes}
	if !e.causes.unknown && e.checkpoints > 0 {
		// colo-compare's own counts are exact; the interval's guess is only for a QEMU without them.
		c := e.causes.life
		st.CausesKnown, st.OnMismatch, st.OnTimeout, st.OnUnparsed, st.OnCrossed, st.UnparsedHeld = true, c.Mismatch, c.Timeout, c.Unparsed, c.Crossed, c.Held
		st.Forced = min(c.Mismatch+c.Timeout+c.Unparsed+c.Crossed, e.checkpoints)
	}
	if e.streams != nil {
		for _, c := range e.streams.counters {
			st.Bytes += c.Sent()
		}
	}
	return st
}

// Run implements engine.Engine: the side runs the VM. A secondary goes live first (or finishes
// the go-live an earlier lockstepd began); a primary that found an earlier protection left in
// its QEMU ends it (it holds the record now); then every
// Resync protects the VM with the agent's new secondary, and Unprotect lets it run on alone.
func (e *Engine) Run(ctx context.Context, rec engine.Recorder) error {
	q, err := e.begin(ctx)
	if err != nil {
		return err
	}
	var retry <-chan time.Time
	watch := time.NewTicker(e.watchEvery)
	defer watch.Stop()
	broken := 0 // consecutive checks that found the protection broken
	events := q.Events()
	var exited <-chan time.Time // a COLO_EXIT on an error, to judge
	var exitedFor string        // the secondary of the protection it came in
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-q.Done():
			return errors.New("QEMU's monitor closed: QEMU exited")
		case cp := <-e.cps:
			e.logCheckpoint(ctx, rec, cp)
			e.readCauses(ctx, q)
			continue
		case <-watch.C:
			var err error
			if broken, err = e.watchProtection(ctx, q, rec, broken, ""); err != nil {
				return err
			}
			continue
		case ev, ok := <-events:
			if !ok {
				events = nil
			} else if coloExitedOnError(ev) && exited == nil {
				// Judged a look later: a QEMU that is being killed (libvirt's destroy sends
				// SIGTERM first) leaves COLO with this error too, and its death, which lets the
				// secondary take over, must come first. Only a QEMU that lives on is claimed for,
				// and only for the protection the event came in: by then the engine may protect
				// the next secondary.
				exitedFor, exited = e.currentProtection(), time.After(e.watchEvery)
			}
			continue
		case <-exited:
			exited = nil
			if exitedFor == "" || e.currentProtection() != exitedFor {
				continue
			}
			var err error
			if broken, err = e.watchProtection(ctx, q, rec, broken, "QEMU left COLO: a checkpoint failed (COLO_EXIT)"); err != nil {
				return err
			}
			continue
		case <-e.kick:
		case <-retry:
			retry = nil
		}
		e.mu.Lock()
		unprotect, gen, done := e.unprotect, e.resync, e.resynced
		// The protection the agent's claim ended: not one the engine made since, with another
		// secondary (a claim the engine asked for comes back while it protects the next one).
		unprotect = unprotect && (e.unprotectFrom == "" || e.unprotectFrom == e.protectedPeer)
		e.unprotect = false
		e.mu.Unlock()
		if unprotect {
			e.teardown(ctx, q)
		}
		// A paused VM is protected once it runs again (Resume pokes the loop).
		if gen != done && !e.isPaused() {
			if err := e.protect(ctx, q, rec); err != nil {
				e.cfg.Log.Error(err, "protecting the VM failed; it runs alone and protection is retried")
				e.mu.Lock()
				e.protectErr = protectFailure(e.protectErr, err)
				e.mu.Unlock()
				if err := e.endProtection(ctx, q, rec, err.Error()); err != nil {
					return err // fenced, with the VM's output still held
				}
				retry = time.After(2 * time.Second)
				continue
			}
			e.mu.Lock()
			e.resynced, e.protectErr = gen, ""
			e.mu.Unlock()
		}
	}
}

// protectFailure is what the status says of a failed protection, after prev. A secondary whose
// first protection failed cannot be migrated into again, so every retry then fails the same way
// (errProtectedOnce) until a new secondary replaces it; the first failure's reason, the one a
// person can act on, stays in the message.
func protectFailure(prev string, err error) string {
	switch {
	case !errors.Is(err, errProtectedOnce) || prev == "":
		return err.Error()
	case strings.HasPrefix(prev, errProtectedOnce.Error()):
		return prev
	}
	return err.Error() + "; its protection failed first: " + prev
}

// watchProtection checks that an established protection still holds: a protection can break
// underneath while both lockstepds still talk (QEMU left COLO on a stream error and waits, the VM
// stopped and its output held). The second check in a row that finds it broken, or one that
// QEMU's COLO_EXIT says broke (known), ends it, the pair claimed from the secondary first
// (endProtection); the agent then asks for a new secondary. It returns the count of consecutive
// broken checks, and an error when the pair could not be claimed (the side is fenced).
func (e *Engine) watchProtection(ctx context.Context, q *qmp.Conn, rec engine.Recorder, broken int, known string) (int, error) {
	e.mu.Lock()
	protected := e.protected
	e.mu.Unlock()
	if !protected {
		return 0, nil
	}
	why := known
	if why == "" {
		cctx, cancel := context.WithTimeout(ctx, e.monitorTimeout)
		why = e.brokenBecause(cctx, q)
		stuck := errors.Is(cctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
		cancel()
		if stuck {
			why = fmt.Sprintf("QEMU did not answer its monitor for %s", e.monitorTimeout)
		}
		if why == "" {
			return 0, nil
		}
		if broken++; broken < 2 {
			return broken, nil
		}
		if stuck {
			// QEMU's main loop is stuck, with its big lock held (a filter-mirror writing into a
			// full socket does that), so its vCPUs and every reply are too; nothing sent over
			// its monitor would be carried out. The secondary holds the last checkpoint, and
			// nothing after it has left: the engine stops, the side is fenced (its QEMU killed)
			// and the secondary, told that this side resigned, takes over.
			return 0, fmt.Errorf("the VM is stuck while protected: %s, twice in a row", why)
		}
	}
	e.cfg.Log.Info("the protection broke; the pair is claimed from the secondary before the VM's output leaves", "why", why)
	e.mu.Lock()
	e.protectErr = "the protection broke: " + why
	e.mu.Unlock()
	return 0, e.endProtection(ctx, q, rec, why)
}

// brokenBecause says why the current protection no longer holds, or "": QEMU is not the COLO
// primary, the secondary's packet streams are down, or no checkpoint came for too long (QEMU's
// COLO stays "primary" after a checkpoint failed).
func (e *Engine) brokenBecause(ctx context.Context, q *qmp.Conn) string {
	holds, err := e.holds(ctx, q)
	switch {
	case err != nil:
		return err.Error()
	case !holds:
		return "the secondary's packet streams are down"
	}
	return e.checkpointsStalled(time.Now())
}

// coloExitedOnError says whether ev is QEMU's COLO_EXIT of a primary whose checkpoints failed
// (not one that lockstepd asked for).
func coloExitedOnError(ev qmp.Event) bool {
	if ev.Name != "COLO_EXIT" {
		return false
	}
	var d struct{ Mode, Reason string }
	return json.Unmarshal(ev.Data, &d) == nil && d.Mode == modePrimary && d.Reason == "error"
}

// checkpointsStalled says why the protection no longer checkpoints, or "": QEMU's COLO stays
// "primary" after a checkpoint failed, with the VM stopped, until someone fails it over, so a
// protection without a checkpoint for stallPeriods of its period (30 s at least) is broken.
func (e *Engine) checkpointsStalled(now time.Time) string {
	e.mu.Lock()
	last := e.lastCheckpoint
	e.mu.Unlock()
	limit := max(stallPeriods*e.cfg.Checkpoint, 30*time.Second)
	if last.IsZero() || now.Sub(last) <= limit {
		return ""
	}
	return fmt.Sprintf("no checkpoint for %s (the last at %s)", now.Sub(last).Round(time.Second), last.UTC().Format(time.RFC3339))
}

// stallPeriods is how many checkpoint periods without one mean that COLO stopped.
const stallPeriods = 10

// currentProtection is the secondary of the established protection, or "".
func (e *Engine) currentProtection() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.protected {
		return ""
	}
	return e.protectedPeer
}

// begin makes the side run the VM (see Run) and returns its QEMU's monitor.
func (e *Engine) begin(ctx context.Context) (*qmp.Conn, error) {
	e.mu.Lock()
	q, live, leftover := e.q, e.live, e.leftover
	e.leftover = false
	e.mu.Unlock()
	if q == nil {
		return nil, errors.New("QEMU is not attached")
	}
	switch {
	case !live:
		if err := e.goLive(ctx, q, e.cfg.Primary); err != nil {
			return nil, err
		}
	case leftover:
		// Only now, with the record won, may colo-compare release what it holds.
		e.teardown(ctx, q)
	default:
		if err := q.Execute(ctx, "cont", nil, nil); err != nil {
			return nil, err
		}
	}
	return q, nil
}

func (e *Engine) logCheckpoint(ctx context.Context, rec engine.Recorder, cp Checkpoint) {
	e.mu.Lock()
	protected := e.protected
	e.mu.Unlock()
	if !protected {
		return
	}
	data, _ := json.Marshal(entry{Kind: "checkpoint", Checkpoint: cp.N, Pause: cp.Pause})
	if _, err := rec.Append(ctx, data); err != nil && ctx.Err() == nil {
		e.cfg.Log.Info("checkpoint not logged", "err", err.Error())
	}
}

// Pause implements engine.Pauser: it stops the vCPUs of a VM that runs alone. A protected
// primary cannot be paused: each COLO checkpoint runs its VM again, and its secondary's too; the
// agent stops it instead (its secondary, if it can reach the record, takes over).
func (e *Engine) Pause(ctx context.Context) error {
	e.mu.Lock()
	q, busy := e.q, e.protected || e.protecting != nil
	if !busy {
		e.paused = true
	}
	e.mu.Unlock()
	switch {
	case busy:
		return errors.New("a COLO primary with a secondary cannot be paused: its checkpoints run the VM again")
	case q == nil:
		return errors.New("not attached to the member's QEMU")
	}
	return q.Execute(ctx, "stop", nil, nil)
}

func (e *Engine) isPaused() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.paused
}

// Resume implements engine.Pauser.
func (e *Engine) Resume(ctx context.Context) error {
	e.mu.Lock()
	q := e.q
	e.mu.Unlock()
	if q == nil {
		return errors.New("not attached to the member's QEMU")
	}
	if err := q.Execute(ctx, "cont", nil, nil); err != nil {
		return err
	}
	e.mu.Lock()
	e.paused = false
	e.mu.Unlock()
	e.poke() // a protection that waited starts now
	return nil
}
