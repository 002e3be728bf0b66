package colo

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/lockstep-dev/lockstep/internal/qmp"
)

// colo-compare's counts of the checkpoints it asked for, by cause: read-only properties of the
// compare object in lockstep's QEMU (hack/qemu/colo-compare-checkpoint-causes.patch). The
// frame's own, periodic checkpoints are the rest. A QEMU without the patch has neither.
const (
	// compareID is the primary's colo-compare object: StartPrimary adds it, PrimaryGoAlone
	// deletes it, and CompareCauses reads its counts.
	compareID          = "comp0"
	compareObject      = "/objects/" + compareID
	propOnMismatch     = "x-checkpoints-on-mismatch"
	propOnTimeout      = "x-checkpoints-on-timeout"
	compareCauseBudget = time.Second
)

// errNoCauses is what CompareCauses says of a QEMU that does not count causes.
var errNoCauses = errors.New("this QEMU's colo-compare does not count the causes of its checkpoints")

// CompareCauses reads how many checkpoints the primary's colo-compare asked for because the two
// sides' packets differed, and because a packet waited past the compare timeout, since it was
// created (with this protection).
func CompareCauses(ctx context.Context, q *qmp.Conn) (mismatch, timeout uint64, err error) {
	for _, r := range []struct {
		prop string
		into *uint64
	}{{propOnMismatch, &mismatch}, {propOnTimeout, &timeout}} {
		if err := q.Execute(ctx, "qom-get", map[string]any{"path": compareObject, "property": r.prop}, r.into); err != nil {
			var qe *qmp.Error
			if errors.As(err, &qe) && strings.Contains(qe.Desc, "Property") && strings.Contains(qe.Desc, "not found") {
				return 0, 0, errNoCauses
			}
			return 0, 0, err
		}
	}
	return mismatch, timeout, nil
}

// causeCounts are the engine's checkpoints by the cause colo-compare gave, over the side's life.
type causeCounts struct {
	unknown           bool   // the QEMU does not count them
	mismatch, timeout uint64 // over the side's life
	seen              [2]uint64
}

// add takes in what the current compare object counts: its counts start at zero with each
// protection (newProtection), so what is new is what grew since the last read.
func (c *causeCounts) add(mismatch, timeout uint64) {
	if mismatch >= c.seen[0] {
		c.mismatch += mismatch - c.seen[0]
	}
	if timeout >= c.seen[1] {
		c.timeout += timeout - c.seen[1]
	}
	c.seen = [2]uint64{mismatch, timeout}
}

// newProtection forgets the last compare object's counts: the next one counts from zero.
func (c *causeCounts) newProtection() { c.seen = [2]uint64{} }

// readCauses updates the engine's counts of causes after a checkpoint. A QEMU that does not count
// them is not asked again; a read that fails otherwise (the protection ending) is skipped.
func (e *Engine) readCauses(ctx context.Context, q *qmp.Conn) {
	e.mu.Lock()
	skip := e.causes.unknown || !e.protected
	e.mu.Unlock()
	if skip {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, compareCauseBudget)
	defer cancel()
	mismatch, timeout, err := CompareCauses(ctx, q)
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case errors.Is(err, errNoCauses):
		e.causes.unknown = true
		e.cfg.Log.Info("checkpoints are not told apart by cause", "reason", err.Error())
	case err == nil && e.protected:
		e.causes.add(mismatch, timeout)
	}
}
