package colo

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os/exec"
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
	// Pair names the FaultTolerantVM ("namespace/name"); the relay routes its streams by it.
	Pair string
	// Primary: the member starts the VM; otherwise it starts a secondary QEMU that waits for COLO.
	Primary bool
	VM      VM
	// Disk is the primary's disk; Parent, Active and Hidden are the secondary's replica of it and
	// COLO's two overlays (see SecondaryArgs).
	Disk, Parent, Active, Hidden string
	// Sockets is the member's socket directory, shared by its QEMU and lockstepd.
	Sockets Sockets
	// Checkpoint is the longest time between two checkpoints (x-checkpoint-delay).
	Checkpoint time.Duration
	// CompareTimeout is how long colo-compare holds a packet of the primary that the secondary
	// has not matched before it forces a checkpoint (QEMU's default: 3 s). A short one bounds the
	// latency that a slow or diverging secondary adds to the VM's replies, at the cost of more
	// checkpoints.
	CompareTimeout time.Duration
	// Command makes the QEMU process from its arguments; it may wrap them (a network namespace,
	// a cgroup). The engine starts it, and kills it when the side is fenced.
	Command func(args []string) *exec.Cmd
	// Relay is the node's stream server; TLS and Dial reach the peer node's.
	Relay *relay.Server
	TLS   *tls.Config
	Dial  func(ctx context.Context, addr string) (net.Conn, error)
	// Attach, when set, attaches the VM's network to the node when a secondary goes live; the
	// engine then announces the VM's address (QMP announce-self) so that switches learn its new
	// port.
	Attach func(ctx context.Context) error
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
type Engine struct {
	cfg  EngineConfig
	kick chan struct{}
	cps  chan Checkpoint

	mu           sync.Mutex
	peer         string // the peer lockstepd's stream address
	cmd          *exec.Cmd
	exited       chan struct{}
	q            *qmp.Conn
	live         bool // runs the VM: the primary, or a secondary that went live
	wasSecondary bool // keeps the filter-rewriter of its secondary days
	resync       uint64
	resynced     uint64
	unprotect    bool
	protected    bool
	streams      *pairing
	bytesDone    uint64
	interval     time.Duration // moving average of the checkpoint intervals
}

// pairing is the relayed streams of one protection (or, on a secondary, of its pair).
type pairing struct {
	cancel   context.CancelFunc
	counters []*relay.Counters
	names    []string // the stream of each counter
	routes   []string
}

// NewEngine makes a member's engine; Start launches its QEMU.
func NewEngine(cfg EngineConfig) *Engine {
	if cfg.Checkpoint <= 0 {
		cfg.Checkpoint = 2 * time.Second
	}
	if cfg.CompareTimeout <= 0 {
		cfg.CompareTimeout = 3 * time.Second
	}
	return &Engine{cfg: cfg, kick: make(chan struct{}, 1), cps: make(chan Checkpoint, 256), live: cfg.Primary}
}

var _ interface {
	engine.Engine
	engine.Unprotector
	engine.StreamReporter
} = (*Engine)(nil)

// SetPeer sets the peer lockstepd's stream address: where a secondary's packet streams go, and
// where the next protection's streams go.
func (e *Engine) SetPeer(addr string) {
	e.mu.Lock()
	e.peer = addr
	e.mu.Unlock()
}

func (e *Engine) peerAddr() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.peer
}

// Start launches the member's QEMU: a primary paused until Run, a secondary ready to be migrated
// into (its streams routed to the peer set by SetPeer).
func (e *Engine) Start(ctx context.Context) error {
	var args []string
	if e.cfg.Primary {
		args = PrimaryArgs(e.cfg.VM, e.cfg.Disk)
	} else {
		// The packet streams' sockets must listen before QEMU dials them.
		e.pairWith(nil, []string{StreamMirror, StreamCompare}, []string{StreamMigration, StreamNBD})
		args = SecondaryArgs(e.cfg.VM, e.cfg.Parent, e.cfg.Active, e.cfg.Hidden, e.cfg.Sockets)
	}
	cmd := e.cfg.Command(args)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start QEMU: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	e.mu.Lock()
	e.cmd, e.exited = cmd, exited
	e.mu.Unlock()
	q, err := qmp.DialWhenUp(ctx, e.cfg.VM.QMP, exited)
	if err != nil {
		e.Stop()
		return err
	}
	e.mu.Lock()
	e.q = q
	e.mu.Unlock()
	if !e.cfg.Primary {
		if err := StartSecondary(ctx, q, e.cfg.Sockets); err != nil {
			e.Stop()
			return err
		}
	}
	return nil
}

// pairWith relays the pair's streams: forwards for the ones this side's QEMU dials, routes for
// the ones it listens on, until unpair. cps, when set, reads the migration stream's return path.
func (e *Engine) pairWith(cps *Checkpoints, dials, listens []string) {
	pctx, cancel := context.WithCancel(context.Background())
	p := &pairing{cancel: cancel}
	for _, s := range dials {
		f := &relay.Forward{Pair: e.cfg.Pair, Stream: s, Path: e.cfg.Sockets.Path(s), Peer: e.peerAddr, TLS: e.cfg.TLS, Dial: e.cfg.Dial}
		if s == StreamMigration && cps != nil {
			f.FromPeer = cps.Observe
		}
		if err := f.Listen(pctx); err != nil {
			e.cfg.Log.Error(err, "relay")
		}
		p.counters, p.names = append(p.counters, &f.Counters), append(p.names, s)
	}
	for _, s := range listens {
		p.counters, p.names = append(p.counters, e.cfg.Relay.Route(e.cfg.Pair, s, e.cfg.Sockets.Path(s))), append(p.names, s)
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
		e.cfg.Relay.Unroute(e.cfg.Pair, s)
	}
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
	e.mu.Lock()
	q := e.q
	e.mu.Unlock()
	if q == nil {
		return errors.New("the secondary's QEMU is not running")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return WaitMode(ctx, q, "secondary")
}

// Resync implements engine.Engine: protect the VM with the agent's new secondary.
func (e *Engine) Resync() {
	e.mu.Lock()
	e.resync++
	e.mu.Unlock()
	e.poke()
}

// Unprotect implements engine.Unprotector.
func (e *Engine) Unprotect() {
	e.mu.Lock()
	e.unprotect = true
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
	st := engine.StreamStats{Bytes: e.bytesDone, Interval: e.interval}
	if e.streams != nil {
		for _, c := range e.streams.counters {
			st.Bytes += c.Sent()
		}
	}
	return st
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

// PID is QEMU's process id (0 before Start).
func (e *Engine) PID() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cmd == nil || e.cmd.Process == nil {
		return 0
	}
	return e.cmd.Process.Pid
}

// Execute runs a QMP command on the member's QEMU, for inspection (its QMP socket has one
// client: the engine).
func (e *Engine) Execute(ctx context.Context, cmd string, args, result any) error {
	e.mu.Lock()
	q := e.q
	e.mu.Unlock()
	if q == nil {
		return errors.New("QEMU is not running")
	}
	return q.Execute(ctx, cmd, args, result)
}

// Stop implements engine.Engine: kill QEMU (the side was fenced) and wait until it is gone.
func (e *Engine) Stop() {
	e.mu.Lock()
	cmd, exited := e.cmd, e.exited
	e.mu.Unlock()
	e.unpair()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Kill()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		e.cfg.Log.Info("QEMU did not exit 10s after SIGKILL")
	}
}

// Run implements engine.Engine: the side runs the VM. A secondary goes live first; then every
// Resync protects the VM with the agent's new secondary, and Unprotect lets it run on alone.
func (e *Engine) Run(ctx context.Context, rec engine.Recorder) error {
	e.mu.Lock()
	q, live, exited := e.q, e.live, e.exited
	e.mu.Unlock()
	if q == nil {
		return errors.New("QEMU is not running")
	}
	if live {
		if err := q.Execute(ctx, "cont", nil, nil); err != nil {
			return err
		}
	} else if err := e.goLive(ctx, q); err != nil {
		return err
	}
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-exited:
			return errors.New("QEMU exited")
		case cp := <-e.cps:
			e.mu.Lock()
			protected := e.protected
			e.mu.Unlock()
			if protected {
				data, _ := json.Marshal(entry{Kind: "checkpoint", Checkpoint: cp.N, Pause: cp.Pause})
				if _, err := rec.Append(ctx, data); err != nil && ctx.Err() == nil {
					e.cfg.Log.Info("checkpoint not logged", "err", err.Error())
				}
			}
			continue
		case <-e.kick:
		case <-retry:
			retry = nil
		}
		e.mu.Lock()
		unprotect, gen, done := e.unprotect, e.resync, e.resynced
		e.unprotect = false
		e.mu.Unlock()
		if unprotect {
			e.teardown(ctx, q)
		}
		if gen != done {
			if err := e.protect(ctx, q, rec); err != nil {
				e.cfg.Log.Error(err, "protecting the VM failed; it runs alone and protection is retried")
				e.teardown(ctx, q)
				retry = time.After(2 * time.Second)
				continue
			}
			e.mu.Lock()
			e.resynced = gen
			e.mu.Unlock()
		}
	}
}

// goLive makes the secondary the VM: cut the dead primary's streams, leave COLO, attach the
// network and announce the VM's address from here.
func (e *Engine) goLive(ctx context.Context, q *qmp.Conn) error {
	e.unpair()
	if err := SecondaryGoLive(ctx, q); err != nil {
		return err
	}
	e.mu.Lock()
	e.live, e.wasSecondary = true, true
	e.mu.Unlock()
	if e.cfg.Attach != nil {
		if err := e.cfg.Attach(ctx); err != nil {
			return fmt.Errorf("attach the VM's network: %w", err)
		}
	}
	return q.Execute(ctx, "announce-self", map[string]any{"initial": 50, "max": 550, "rounds": 5, "step": 50}, nil)
}

// protect resyncs the secondary's disk, then migrates the VM into COLO with it, and logs "ready"
// once the secondary holds the whole state.
func (e *Engine) protect(ctx context.Context, q *qmp.Conn, rec engine.Recorder) error {
	e.teardown(ctx, q) // what an earlier protection left
	peer := e.peerAddr()
	if peer == "" {
		return errors.New("no secondary to protect the VM with")
	}
	// QEMU connects to the secondary's replica synchronously: make sure the peer answers first.
	if err := retryFor(ctx, time.Minute, func() error { return relay.Probe(ctx, peer, e.cfg.TLS, e.cfg.Dial) }); err != nil {
		return fmt.Errorf("the secondary's node %s does not answer: %w", peer, err)
	}
	ready := make(chan struct{})
	var once sync.Once
	cps := &Checkpoints{OnReady: func() { once.Do(func() { close(ready) }) }, OnCheckpoint: e.checkpoint}
	e.pairWith(cps, []string{StreamMigration, StreamNBD}, []string{StreamMirror, StreamCompare})
	if err := PrimaryChardevs(ctx, q, e.cfg.Sockets); err != nil {
		return err
	}
	// The secondary may still be starting: retry until its replica answers.
	if err := retryFor(ctx, time.Minute, func() error { return ResyncDisk(ctx, q, e.cfg.Sockets) }); err != nil {
		return fmt.Errorf("resync the disk: %w", err)
	}
	if err := retryFor(ctx, 10*time.Minute, func() error {
		jobs, err := Jobs(ctx, q)
		if err != nil {
			return err
		}
		if len(jobs) == 0 || !jobs[0].Ready {
			return errors.New("the disk resync is not done")
		}
		return nil
	}); err != nil {
		return err
	}
	// Nothing may change between the resync's end and the first checkpoint.
	if err := q.Execute(ctx, "stop", nil, nil); err != nil {
		return err
	}
	if err := q.Execute(ctx, "block-job-cancel", map[string]any{"device": "resync"}, nil); err != nil {
		return err
	}
	if err := retryFor(ctx, time.Minute, func() error {
		if jobs, err := Jobs(ctx, q); err != nil || len(jobs) > 0 {
			return errors.New("the resync job is still there")
		}
		return nil
	}); err != nil {
		return err
	}
	// The secondary's packet streams must be connected before its copy of the VM runs.
	if err := retryFor(ctx, 30*time.Second, func() error {
		if ok, err := Connected(ctx, q, "mirror0", "compare1"); err != nil || !ok {
			return errors.New("the secondary's packet streams are not connected")
		}
		return nil
	}); err != nil {
		return err
	}
	e.mu.Lock()
	afterRewriter := e.wasSecondary
	e.mu.Unlock()
	if err := StartPrimary(ctx, q, e.cfg.Sockets, e.cfg.Checkpoint, e.cfg.CompareTimeout, afterRewriter); err != nil {
		return err
	}
	select {
	case <-ready:
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(5 * time.Minute):
		return errors.New("the secondary did not enter COLO within 5 minutes")
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := WaitMode(wctx, q, "primary"); err != nil {
		return err
	}
	data, _ := json.Marshal(entry{Kind: "ready"})
	if _, err := rec.Append(ctx, data); err != nil {
		return err
	}
	e.mu.Lock()
	e.protected = true
	e.mu.Unlock()
	return nil
}

func (e *Engine) checkpoint(cp Checkpoint) {
	e.mu.Lock()
	if cp.Interval > 0 {
		if e.interval == 0 {
			e.interval = cp.Interval
		} else {
			e.interval += (cp.Interval - e.interval) / 8
		}
	}
	e.mu.Unlock()
	if e.cfg.OnCheckpoint != nil {
		e.cfg.OnCheckpoint(cp)
	}
	select {
	case e.cps <- cp:
	default: // the log is behind; the next checkpoint's entry supersedes this one
	}
}

// teardown ends the current protection, if any: cut its streams first (a secondary that is
// silent rather than dead must not block QEMU's teardown), leave COLO, and make sure the VM runs.
func (e *Engine) teardown(ctx context.Context, q *qmp.Conn) {
	e.unpair()
	e.mu.Lock()
	e.protected = false
	e.mu.Unlock()
	if err := PrimaryGoAlone(ctx, q); err != nil {
		e.cfg.Log.Error(err, "go alone")
	}
	steps := []step{{"block-job-cancel", map[string]any{"device": "resync", "force": true}}}
	for _, id := range []string{"compare_out0", "compare_out", "compare0-0", "compare0", "compare1", "mirror0"} {
		steps = append(steps, step{"chardev-remove", map[string]any{"id": id}})
	}
	if err := run(ctx, q, "primary teardown", true, steps); err != nil {
		e.cfg.Log.Error(err, "teardown")
	}
	var st struct {
		Running bool   `json:"running"`
		Status  string `json:"status"`
	}
	if err := q.Execute(ctx, "query-status", nil, &st); err == nil && !st.Running {
		if err := q.Execute(ctx, "cont", nil, nil); err != nil {
			e.cfg.Log.Error(err, "resume the VM", "status", st.Status)
		}
	}
}

func retryFor(ctx context.Context, limit time.Duration, fn func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
