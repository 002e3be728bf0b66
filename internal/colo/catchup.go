package colo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lockstep-dev/lockstep/internal/qmp"
)

// The incremental resync ("catch-up"). A secondary whose copies hold the replica of an earlier
// secondary of this primary (that secondary was fenced or died without going live, so its replica
// holds every write the primary replicated to it) needs only what the VM wrote since. QEMU 10.2's
// mirror takes no bitmap (mirror_start refuses the bitmap sync modes), so the catch-up copies
// with blockdev-backup, sync=bitmap, into an NBD node of the new secondary's replica, in rounds:
// each round copies what the bitmap marked when it started (bitmap-mode on-success: the bitmap
// then marks only what the VM wrote during the round), until a round is small; the last round
// runs with the VM stopped, and the replica is the disk.
//
// The bitmap, replicaBitmap on each quorum, starts at the end of every resync (full or not), with
// the VM stopped and each replica equal to its disk: it marks every block written since, whether
// COLO replicated the write or not (a superset of what the replica lacks). It lives in the
// primary's QEMU only (raw images keep no persistent bitmap): a primary whose QEMU restarted, or
// a new primary after a failover, resyncs in full.

// replicaBitmap marks what the VM wrote to a disk since its replica on the tracked secondary was
// last equal to it.
const replicaBitmap = "lockstep-replica"

// catchUpNode is the primary's NBD client node of its i-th disk's replica during a catch-up; the
// job that copies into it has the same name (jobs and nodes have separate names).
func catchUpNode(i int) string { return "catchup" + strconv.Itoa(i) }

// catchUpLastRound: a round that copied less than this runs the last round next, with the VM
// stopped; maxCatchUpRounds bounds the rounds with the VM running (a VM that writes faster than
// the link copies would never get below it).
const (
	catchUpLastRound = 64 << 20
	maxCatchUpRounds = 8
)

// TrackReplica starts tracking what the VM writes to each of its disks from now on (replicaBitmap,
// replaced if there was one). The VM must be stopped, each replica equal to its disk.
func TrackReplica(ctx context.Context, q *qmp.Conn, disks int) error {
	for i := range disks {
		err := q.Execute(ctx, "block-dirty-bitmap-remove", map[string]any{"node": DiskNode(i), "name": replicaBitmap}, nil)
		if err != nil && !strings.Contains(err.Error(), "not found") {
			return fmt.Errorf("disk %d: %w", i, err)
		}
		if err := q.Execute(ctx, "block-dirty-bitmap-add", map[string]any{"node": DiskNode(i), "name": replicaBitmap}, nil); err != nil {
			return fmt.Errorf("disk %d: %w", i, err)
		}
	}
	return nil
}

// catchUpDisks brings the secondary's replicas, which held each disk when replicaBitmap started,
// up to the disks, and returns with the VM stopped (as resyncDisks does) and the bytes it copied.
// On an error the VM runs again, and the replicas are to be resynced in full.
func catchUpDisks(ctx context.Context, q *qmp.Conn, s Sockets, disks int, progress func(done, total uint64)) (copied uint64, err error) {
	var attached []int
	defer func() {
		// Also when ctx ended (the protection was called off): the jobs and the replicas' nodes
		// must go, or the next protection finds them in its way.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err != nil {
			abandonCatchUp(cctx, q)
		}
		for _, i := range attached {
			if derr := q.Execute(cctx, "blockdev-del", map[string]any{"node-name": catchUpNode(i)}, nil); derr != nil && err == nil {
				err = fmt.Errorf("detach the replica of disk %d: %w", i, derr)
			}
		}
		if err != nil {
			_ = q.Execute(cctx, "cont", nil, nil)
		}
	}()
	for i := range disks {
		// The secondary may still be starting: retry until its replica answers.
		if err := retryFor(ctx, time.Minute, func() error {
			return q.Execute(ctx, "blockdev-add", map[string]any{"driver": "nbd", "node-name": catchUpNode(i),
				"server": map[string]any{"type": "unix", "path": s.Path(StreamNBD)}, "export": parentNode(i)}, nil)
		}); err != nil {
			return copied, fmt.Errorf("attach the replica of disk %d: %w", i, err)
		}
		attached = append(attached, i)
	}
	for round := 1; ; round++ {
		last := round > maxCatchUpRounds
		if last {
			if err := q.Execute(ctx, "stop", nil, nil); err != nil {
				return copied, err
			}
		}
		n, err := catchUpRound(ctx, q, disks, copied, progress)
		copied += n
		if err != nil {
			return copied, fmt.Errorf("catch-up round %d: %w", round, err)
		}
		if last {
			return copied, nil
		}
		if n < catchUpLastRound {
			round = maxCatchUpRounds // the next is the last
		}
	}
}

// abandonCatchUp cancels the catch-up's jobs that still run and dismisses them all, so that their
// replicas' nodes can be detached. (Each round dismisses its jobs once all concluded; a round cut
// short leaves them.)
func abandonCatchUp(ctx context.Context, q *qmp.Conn) {
	_ = retryFor(ctx, 20*time.Second, func() error {
		jobs, err := catchUpJobs(ctx, q)
		if err != nil {
			return err
		}
		running := 0
		for _, j := range jobs {
			switch j.Status {
			case "concluded":
				_ = q.Execute(ctx, "job-dismiss", map[string]any{"id": j.ID}, nil)
			case "null":
			default:
				running++
				_ = q.Execute(ctx, "job-cancel", map[string]any{"id": j.ID}, nil)
			}
		}
		if running > 0 {
			return fmt.Errorf("%d catch-up jobs still run", running)
		}
		return nil
	})
}

// catchUpJob is a catch-up job as query-jobs has it.
type catchUpJob struct {
	ID       string `json:"id"`
	Status   string `json:"status"`
	Current  uint64 `json:"current-progress"`
	Total    uint64 `json:"total-progress"`
	ErrorMsg string `json:"error"`
}

// catchUpJobs are the catch-up's jobs in QEMU.
func catchUpJobs(ctx context.Context, q *qmp.Conn) ([]catchUpJob, error) {
	var jobs []catchUpJob
	if err := q.Execute(ctx, "query-jobs", nil, &jobs); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(jobs, func(j catchUpJob) bool { return !strings.HasPrefix(j.ID, "catchup") }), nil
}

// catchUpRound copies, for each disk, what replicaBitmap marks into its replica, and returns the
// bytes copied; progress sees them added to before.
func catchUpRound(ctx context.Context, q *qmp.Conn, disks int, before uint64, progress func(done, total uint64)) (uint64, error) {
	for i := range disks {
		if err := q.Execute(ctx, "blockdev-backup", map[string]any{"job-id": catchUpNode(i), "device": DiskNode(i), "target": catchUpNode(i),
			"sync": "bitmap", "bitmap": replicaBitmap, "bitmap-mode": "on-success", "auto-dismiss": false}, nil); err != nil {
			return 0, fmt.Errorf("disk %d: %w", i, err)
		}
	}
	for {
		jobs, err := catchUpJobs(ctx, q)
		if err != nil {
			return 0, err
		}
		var done, total uint64
		concluded, errs := 0, []string(nil)
		for _, j := range jobs {
			done, total = done+j.Current, total+j.Total
			if j.Status == "concluded" {
				concluded++
				if j.ErrorMsg != "" {
					errs = append(errs, j.ID+": "+j.ErrorMsg)
				}
			}
		}
		progress(before+done, before+total)
		if concluded == disks {
			for i := range disks {
				if err := q.Execute(ctx, "job-dismiss", map[string]any{"id": catchUpNode(i)}, nil); err != nil {
					return done, err
				}
			}
			if len(errs) > 0 {
				return done, errors.New(strings.Join(errs, "; "))
			}
			return done, nil
		}
		select {
		case <-ctx.Done():
			return done, ctx.Err()
		case <-time.After(resyncPoll / 5):
		}
	}
}
