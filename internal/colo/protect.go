package colo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/qmp"
	"github.com/lockstep-dev/lockstep/internal/relay"
)

// goLiveAttempts and goLiveRetry bound the retries of a go-live step that failed: the member
// that goes live holds the pair's record and the only copy of the VM's state, and stopping it for
// one failed command would lose that state (the VM restarts from its disks).
const (
	goLiveAttempts = 3
	goLiveRetry    = 500 * time.Millisecond
)

// goLive makes the secondary the VM: cut the dead primary's streams, leave COLO, attach the
// network and announce the VM's address from here. A failed step is tried again (the steps
// already done count as done); a failed announcement is not fatal: the VM runs, and clients
// learn its address when their ARP entries expire.
// resume: an earlier lockstepd began it (see Engine.live).
func (e *Engine) goLive(ctx context.Context, q *qmp.Conn, resume bool) error {
	e.unpair()
	err := retry(ctx, e.cfg.Log, "leaving COLO", func(attempt int) error {
		if resume || attempt > 0 {
			return FinishSecondaryGoLive(ctx, q)
		}
		return SecondaryGoLive(ctx, q)
	})
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.live, e.wasSecondary = true, true
	e.mu.Unlock()
	if e.cfg.AttachNetwork != nil {
		if err := retry(ctx, e.cfg.Log, "attaching the VM's network", func(int) error { return e.cfg.AttachNetwork(ctx) }); err != nil {
			return fmt.Errorf("attach the VM's network: %w", err)
		}
	}
	// The first announcement goes out at once: it must reach the switches before the clients'
	// first retransmission (200 ms at the earliest on Linux) to save them a second one.
	if err := q.Execute(ctx, "announce-self", map[string]any{"initial": 1, "max": 550, "rounds": 5, "step": 50}, nil); err != nil {
		e.cfg.Log.Error(err, "announcing the VM's address failed; it runs, and clients find it once their ARP entries expire")
	}
	return nil
}

// retry runs step up to goLiveAttempts times, goLiveRetry apart, until it succeeds.
func retry(ctx context.Context, log logr.Logger, what string, step func(attempt int) error) error {
	var err error
	for attempt := range goLiveAttempts {
		if attempt > 0 {
			log.Error(err, "going live: a step failed; trying again", "step", what, "attempt", attempt+1)
			select {
			case <-ctx.Done():
				return err
			case <-time.After(goLiveRetry):
			}
		}
		if err = step(attempt); err == nil {
			return nil
		}
	}
	return err
}

// protect resyncs the secondary's disk, then migrates the VM into COLO with it, and logs "ready"
// once the secondary holds the whole state.
//
// A secondary takes the VM's state once: QEMU cannot migrate into a secondary that is in COLO. So
// a protection of the member that the current one already protects is not started again. While
// that protection holds (QEMU is the COLO primary and the secondary's packet streams are up), the
// secondary holds the whole state, and protect only logs "ready" again: the agent asked because
// it started a new log (its first entry must say that the secondary holds the state), and a
// Resync may also come while the protection it asks for is being made. Tearing it down to migrate
// into the same secondary again would hold the VM's output until the migration timed out, and
// leave a synchronized secondary behind a primary that runs alone. When it no longer holds, the
// member cannot be protected again (errProtectedOnce): a new secondary replaces it.
func (e *Engine) protect(ctx context.Context, q *qmp.Conn, rec engine.Recorder) error {
	e.mu.Lock()
	member, protected := e.peer.Member, e.protected
	again := member != "" && member == e.protectedPeer // the VM was migrated into it before
	e.mu.Unlock()
	if again {
		if !protected {
			return fmt.Errorf("%w: secondary %s (its protection ended)", errProtectedOnce, member)
		}
		if holds, err := e.holds(ctx, q); err != nil || !holds {
			return fmt.Errorf("%w: secondary %s (its protection no longer holds: %v)", errProtectedOnce, member, err)
		}
		data, _ := json.Marshal(entry{Kind: "ready"})
		_, err := rec.Append(ctx, data)
		return err
	}
	// What an earlier protection left; one of another secondary that still holds (the daemon
	// named a new peer) ends only once the pair is claimed from that secondary.
	if err := e.endProtection(ctx, q, rec, "the VM is protected with a new secondary, "+member); err != nil {
		return err
	}
	// One protection, one secondary: its streams go to the member it started with, and a new
	// peer (the daemon replaced the secondary) ends it, so that the next one starts afresh. A
	// secondary cannot be migrated into twice.
	e.mu.Lock()
	peer := e.peer
	ctx, cancel := context.WithCancel(ctx)
	e.protecting = cancel
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.protecting = nil
		e.mu.Unlock()
		cancel()
	}()
	tuning, err := PrimaryCapabilities(ctx, q, e.cfg.Tuning)
	if err != nil {
		return err
	}
	if tuning.CrossedWait != e.cfg.CrossedWait {
		e.cfg.Log.Info("this QEMU's colo-compare has no crossed wait (lockstep's hack/qemu/colo-compare-waits-crossed.patch): the two guests' replies that wait for each other wait for the compare timeout",
			"crossedWait", e.cfg.CrossedWait.String(), "compareTimeout", e.cfg.CompareTimeout.String())
	}
	to := target(e.cfg.Pair, peer)
	if to.Addr == "" || peer.Member == "" {
		return errors.New("no secondary to protect the VM with")
	}
	// QEMU connects to the secondary's replica synchronously: make sure the peer answers first.
	if err := retryFor(ctx, time.Minute, func() error { return relay.Probe(ctx, to, e.cfg.TLS, e.cfg.Dial) }); err != nil {
		return fmt.Errorf("the secondary's node %s (%s) does not answer: %w", to.Node, to.Addr, err)
	}
	ready := make(chan struct{})
	var once sync.Once
	cps := &Checkpoints{OnReady: func() { once.Do(func() { close(ready) }) }, OnCheckpoint: e.checkpoint}
	e.pairWith(func() relay.Target { return to }, cps, []string{StreamMigration, StreamNBD}, []string{StreamMirror, StreamCompare})
	if err := PrimaryChardevs(ctx, q, e.cfg.Sockets); err != nil {
		return err
	}
	disks := e.disks()
	if err := e.syncReplicas(ctx, q, peer, disks); err != nil {
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
	e.causes.newProtection()      // StartPrimary creates a new compare object
	e.protectedPeer = peer.Member // from the migration on, the secondary cannot take another
	e.mu.Unlock()
	// A COLO_EXIT that an earlier protection's end left queued must not judge this one.
	for drained := false; !drained; {
		select {
		case _, ok := <-q.Events():
			drained = !ok // closed: QEMU is gone
		default:
			drained = true
		}
	}
	if err := StartPrimary(ctx, q, e.cfg.Sockets, tuning, afterRewriter, disks); err != nil {
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
	if err := WaitMode(wctx, q, modePrimary); err != nil {
		return err
	}
	data, _ := json.Marshal(entry{Kind: "ready"})
	if _, err := rec.Append(ctx, data); err != nil {
		return err
	}
	e.mu.Lock()
	e.protected = true
	e.lastCheckpoint = time.Now()
	e.mu.Unlock()
	return nil
}

// syncReplicas makes each of the secondary's replicas its disk, and returns with the VM stopped: only
// what the VM wrote since, when the secondary's copies hold the replicas of the secondary that
// replicaBitmap tracks (an incremental resync: catchup.go), else the whole disks. The bitmap then
// counts from this secondary.
func (e *Engine) syncReplicas(ctx context.Context, q *qmp.Conn, peer engine.Peer, disks int) error {
	e.mu.Lock()
	incremental := peer.ReplicaOf != "" && peer.ReplicaOf == e.tracked
	e.tracked = "" // from here on the bitmap counts from no secondary's replicas, until it restarts below
	e.mu.Unlock()
	started := time.Now()
	progress := func(done, total uint64) {
		e.mu.Lock()
		e.copying = engine.Resync{Started: started, Done: done, Total: total}
		e.mu.Unlock()
	}
	defer func() {
		e.mu.Lock()
		e.copying = engine.Resync{}
		e.mu.Unlock()
	}()
	var copied uint64
	var err error
	if incremental {
		if copied, err = catchUpDisks(ctx, q, e.cfg.Sockets, disks, progress); err != nil {
			e.cfg.Log.Error(err, "the incremental resync failed; resyncing the whole disks", "replica-of", peer.ReplicaOf)
			incremental = false
		}
	}
	if !incremental {
		if copied, err = resyncDisks(ctx, q, e.cfg.Sockets, disks, progress); err != nil {
			return err
		}
	}
	tracked := peer.Member
	if err := TrackReplica(ctx, q, disks); err != nil {
		// Only the next resync's size depends on it: it copies the whole disks.
		e.cfg.Log.Error(err, "tracking what the VM writes from now on; the next resync copies the whole disks")
		tracked = ""
	}
	e.mu.Lock()
	e.tracked = tracked
	e.lastResync = engine.ResyncDone{Member: peer.Member, Incremental: incremental, Bytes: copied, Took: time.Since(started), At: time.Now()}
	e.mu.Unlock()
	e.cfg.Log.Info("resynced the secondary's disks", "member", peer.Member, "incremental", incremental, "bytes", copied, "took", time.Since(started).Round(time.Millisecond))
	return nil
}

// endProtection ends the current protection, if any, and lets the VM's held output go. A
// protection whose secondary took the VM's state ("ready" was logged) ends only once the pair was
// claimed from that secondary (Recorder.DropSecondary): colo-compare holds every output the
// secondary has not seen, and the teardown releases them; the secondary, which may still answer
// its log, must never go live with the older state after that. When the claim is lost, nothing
// is released: the side is fenced and its VM stopped, and the secondary, whose state covers
// every output that left, may take over.
func (e *Engine) endProtection(ctx context.Context, q *qmp.Conn, rec engine.Recorder, why string) error {
	e.mu.Lock()
	protected, member := e.protected, e.protectedPeer
	e.mu.Unlock()
	if protected {
		if err := rec.DropSecondary(ctx, fmt.Sprintf("the COLO protection by %s ended: %s", member, why)); err != nil {
			return fmt.Errorf("the pair could not be claimed from secondary %s, whose protection ended: %w", member, err)
		}
	}
	e.teardown(ctx, q)
	return nil
}

// errProtectedOnce: a COLO secondary takes the VM's state once (see protect).
var errProtectedOnce = errors.New("a COLO secondary can be migrated into only once; it must be replaced")

// holds says whether the current protection still holds: QEMU is the COLO primary and the
// secondary's packet streams are connected.
func (e *Engine) holds(ctx context.Context, q *qmp.Conn) (bool, error) {
	var st Status
	if err := q.Execute(ctx, "query-colo-status", nil, &st); err != nil {
		return false, err
	}
	if st.Mode != modePrimary {
		return false, fmt.Errorf("COLO mode %q", st.Mode)
	}
	return Connected(ctx, q, "mirror0", "compare1")
}

// resyncDisks copies each of the primary's disks into the secondary's replica, all at once (each
// over its own NBD connection), and stops the VM once every copy has caught up: nothing may
// change between the resync's end and the first checkpoint. It takes as long as the disks need
// (no limit: a big disk on slow storage is not an error), telling progress what is copied of
// what there is every resyncPoll, and fails at once when a copy ends before it caught up.
func resyncDisks(ctx context.Context, q *qmp.Conn, s Sockets, disks int, progress func(done, total uint64)) (uint64, error) {
	// The secondary may still be starting: retry until its replicas answer.
	for i := range disks {
		if err := retryFor(ctx, time.Minute, func() error { return ResyncDisk(ctx, q, s, i) }); err != nil {
			return 0, fmt.Errorf("resync disk %d: %w", i, err)
		}
	}
	var copied uint64
	for {
		jobs, err := Jobs(ctx, q)
		if err != nil {
			return copied, err
		}
		caughtUp, err := resyncState(jobs, disks, func(done, total uint64) { copied = done; progress(done, total) })
		if err != nil {
			return copied, withDiskSizes(ctx, q, disks, err)
		}
		if caughtUp {
			break
		}
		select {
		case <-ctx.Done():
			return copied, ctx.Err()
		case <-time.After(resyncPoll):
		}
	}
	if err := q.Execute(ctx, "stop", nil, nil); err != nil {
		return copied, err
	}
	for i := range disks {
		if err := q.Execute(ctx, "block-job-cancel", map[string]any{"device": resyncJob(i)}, nil); err != nil {
			return copied, err
		}
	}
	return copied, retryFor(ctx, time.Minute, func() error {
		jobs, err := Jobs(ctx, q)
		if err != nil || slices.ContainsFunc(jobs, func(j Job) bool { return strings.HasPrefix(j.ID, "resync") }) {
			return errors.New("the resync jobs are still there")
		}
		return nil
	})
}

func (e *Engine) checkpoint(cp Checkpoint) {
	e.mu.Lock()
	if cp.Interval > 0 { // the first checkpoint has none
		e.interval.Observe(cp.Interval)
	}
	e.pause.Observe(cp.Pause)
	e.checkpoints++
	e.lastCheckpoint = time.Now()
	if Forced(cp, e.cfg.Checkpoint) {
		e.forced++
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
	disks := e.disks()
	if err := PrimaryGoAlone(ctx, q, disks); err != nil {
		e.cfg.Log.Error(err, "go alone")
	}
	var steps []step
	for i := range disks {
		steps = append(steps, step{"block-job-cancel", map[string]any{"device": resyncJob(i), "force": true}})
	}
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

// resyncPoll is how often the resync's progress is read.
const resyncPoll = 500 * time.Millisecond

// resyncState reads the resync jobs of disks disks: whether every one has caught up (QEMU's
// "ready": the copy is whole and follows the guest's writes), what they copied of what there is
// (to progress), and an error for a job that is gone before it caught up (QEMU ended it: most
// often a replica whose size is not the disk's, which QEMU's mirror refuses).
func resyncState(jobs []Job, disks int, progress func(done, total uint64)) (bool, error) {
	byID := map[string]Job{}
	for _, j := range jobs {
		byID[j.ID] = j
	}
	caughtUp := true
	var done, total uint64
	for i := range disks {
		j, ok := byID[resyncJob(i)]
		if !ok {
			return false, fmt.Errorf("the resync of disk %d ended before it caught up: QEMU stopped the copy (QEMU's mirror refuses a secondary's copy whose size is not exactly the disk's)", i)
		}
		caughtUp = caughtUp && j.Ready
		done += uint64(max(j.Done, 0))
		total += uint64(max(j.Len, 0))
	}
	progress(done, total)
	return caughtUp, nil
}

// withDiskSizes adds the sizes of the primary's replicated disks to a resync's error: the
// secondary's copies must be as large.
func withDiskSizes(ctx context.Context, q *qmp.Conn, disks int, err error) error {
	size, qerr := blockDevices(ctx, q)
	if qerr != nil {
		return err
	}
	var sizes []string
	for i := range disks {
		if n, ok := size[DiskNode(i)]; ok {
			sizes = append(sizes, fmt.Sprintf("disk %d: %d bytes", i, n))
		}
	}
	if len(sizes) == 0 {
		return err
	}
	return fmt.Errorf("%w; the primary's disks: %s", err, strings.Join(sizes, ", "))
}
