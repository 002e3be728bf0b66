package colo

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/qmp"
)

// found is what the engine finds in a QEMU it attaches to.
type found struct {
	status   string // query-status: "running", "inmigrate", "paused", ...
	mode     string // query-colo-status: "none", "primary", "secondary"
	rewriter bool   // the secondary's filter-rewriter is there (the member was a secondary)
	// redirectors: the secondary's packet redirectors are there: its go-live has not removed
	// them yet (or it never went live).
	redirectors bool
	disks       []int64 // the replicated disks' sizes (ReplicatedDisks)
}

func inspect(ctx context.Context, q *qmp.Conn) (found, error) {
	var f found
	var st struct {
		Status string `json:"status"`
	}
	if err := q.Execute(ctx, "query-status", nil, &st); err != nil {
		return f, err
	}
	var cs Status
	if err := q.Execute(ctx, "query-colo-status", nil, &cs); err != nil {
		return f, err
	}
	var objs []struct {
		Name string `json:"name"`
	}
	if err := q.Execute(ctx, "qom-list", map[string]any{"path": "/objects"}, &objs); err != nil {
		return f, err
	}
	disks, err := ReplicatedDisks(ctx, q)
	if err != nil {
		return f, err
	}
	f.status, f.mode, f.disks = st.Status, cs.Mode, disks
	for _, o := range objs {
		f.rewriter = f.rewriter || o.Name == "rew0"
		f.redirectors = f.redirectors || o.Name == "f1" || o.Name == "f2"
	}
	return f, nil
}

// Start implements engine.Starter: it attaches to the member's QEMU through lockstepd's monitor
// in the member's directory, and finds out what an earlier lockstepd left there (lockstepd may
// restart while its members run):
//   - a primary attaches whatever it finds; one still in COLO ends that protection in Run, once
//     it holds the record again (the streams went with the old lockstepd);
//   - a primary whose QEMU is still a COLO secondary, or still has a secondary's redirectors,
//     is a secondary that won the record while an earlier lockstepd ran, which died before the
//     go-live was done: Run finishes the go-live (the steps already done count as done);
//   - a secondary must be a fresh one, still waiting for the migration; it is readied for COLO.
//     One left in COLO, or running the VM without the record, can never serve: Start returns
//     engine.ErrFenced and the agent stops it, so that the member is replaced.
//
// An error that does not wrap engine.ErrFenced (no directory or monitor yet: the launcher is
// still starting QEMU) is retried by the agent.
func (e *Engine) Start(ctx context.Context) error {
	if e.conn() != nil {
		return nil
	}
	s := e.cfg.Sockets
	if err := s.Validate(); err != nil {
		return err
	}
	if _, err := os.Stat(s.Dir); err != nil {
		return fmt.Errorf("the member's directory: %w (its launcher has not started QEMU yet)", err)
	}
	e.mu.Lock()
	relayed := e.streams != nil
	e.mu.Unlock()
	if !e.cfg.Primary && !relayed {
		// The secondary's QEMU dials its packet streams (and redials): their sockets listen from
		// now on, and its migration and NBD sockets are routed to.
		// The secondary's packet streams follow its primary as the daemon finds it.
		e.pairWith(e.peerStreams, nil, []string{StreamMirror, StreamCompare}, []string{StreamMigration, StreamNBD})
	}
	q, err := qmp.Dial(ctx, s.QMP())
	if err != nil {
		return fmt.Errorf("lockstepd's monitor of the member's QEMU: %w", err)
	}
	f, err := inspect(ctx, q)
	if err != nil {
		_ = q.Close()
		return fmt.Errorf("inspecting the member's QEMU: %w", err)
	}
	pid := q.PeerPID()
	e.mu.Lock()
	e.q, e.pid, e.replicated, e.diskBytes = q, pid, len(f.disks), f.disks
	e.wasSecondary = f.rewriter
	e.leftover = e.cfg.Primary && f.mode == modePrimary
	unfinishedGoLive := e.cfg.Primary && (f.mode == "secondary" || f.redirectors)
	if unfinishedGoLive {
		e.live = false // Run finishes the go-live
	}
	e.mu.Unlock()
	e.cfg.Log.Info("attached to the member's QEMU", "status", f.status, "colo", f.mode, "diskBytes", f.disks, "pid", pid, "unfinishedGoLive", unfinishedGoLive)
	if e.cfg.Primary {
		return nil
	}
	switch {
	case f.status == "inmigrate" && f.mode == "none":
		return StartSecondary(ctx, q, s, len(f.disks))
	case f.mode == "secondary":
		return fmt.Errorf("%w: its QEMU is still in COLO from a protection whose streams ended with an earlier lockstepd; "+
			"a secondary cannot be migrated into twice, so a new one replaces it", engine.ErrFenced)
	default:
		return fmt.Errorf("%w: its QEMU is %s, not waiting for the migration, and the pair's record does not name it", engine.ErrFenced, f.status)
	}
}

// Stop implements engine.Engine: the side was fenced. It kills the member's QEMU (SIGKILL when
// lockstepd sees its process, QMP quit otherwise) and waits until its monitor closes.
func (e *Engine) Stop() {
	e.unpair()
	e.mu.Lock()
	q, pid := e.q, e.pid
	e.mu.Unlock()
	if q == nil {
		return
	}
	select {
	case <-q.Done():
		return // already gone (the monitor is open as long as the process lives)
	default:
	}
	if pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		// stop first: the vCPUs produce nothing more even if quit takes a while.
		_ = q.Execute(ctx, "stop", nil, nil)
		_ = q.Execute(ctx, "quit", nil, nil)
		cancel()
	}
	select {
	case <-q.Done():
	case <-time.After(10 * time.Second):
		e.cfg.Log.Info("the member's QEMU still answers 10s after it was killed", "pid", pid)
	}
}

// Detach implements engine.Detacher: lockstepd lets go of the member's QEMU (its agent ended)
// and the VM runs on. The relayed streams end with it, as they would with lockstepd's process: a
// protection in progress ends (COLO's sides then wait for the next lockstepd to decide).
func (e *Engine) Detach() {
	e.unpair()
	e.mu.Lock()
	q := e.q
	e.q = nil
	e.mu.Unlock()
	if q != nil {
		_ = q.Close()
	}
}
