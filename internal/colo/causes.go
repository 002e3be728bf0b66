package colo

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/lockstep-dev/lockstep/internal/qmp"
)

// colo-compare's counts of the checkpoints it asked for, by cause, and of the packets it held:
// read-only properties of the compare object in lockstep's QEMU
// (hack/qemu/colo-compare-checkpoint-causes.patch, colo-compare-unparsed-held.patch). The frame's
// own, periodic checkpoints are the rest. A QEMU without the first patch has none of them.
const (
	// compareID is the primary's colo-compare object: StartPrimary adds it, PrimaryGoAlone
	// deletes it, and CompareCauses reads its counts.
	compareID        = "comp0"
	compareObject    = "/objects/" + compareID
	propOnMismatch   = "x-checkpoints-on-mismatch"
	propOnTimeout    = "x-checkpoints-on-timeout"
	propOnUnparsed   = "x-checkpoints-on-unparsed"
	propUnparsedHeld = "x-unparsed-held"
	propOnCrossed    = "x-checkpoints-on-crossed"
	// propCrossedTimeout is the compare object's Tuning.CrossedWait, which StartPrimary sets.
	propCrossedTimeout = "x-crossed-timeout"
	compareCauseBudget = time.Second
)

// errNoCauses is what CompareCauses says of a QEMU that does not count causes.
var errNoCauses = errors.New("this QEMU's colo-compare does not count the causes of its checkpoints")

// Causes are colo-compare's counts since it was created (with its protection): the checkpoints it
// asked for because the two sides' packets differed (Mismatch), because a packet waited past the
// compare timeout (Timeout), because it held a packet it could not parse (Unparsed: IPv6,
// ARP; it holds them until the next checkpoint), or because data of both sides waited crossed
// (Crossed: Tuning's CrossedWait), and how many packets it held so (Held).
type Causes struct {
	Mismatch, Timeout, Unparsed, Crossed, Held uint64
}

// CompareCauses reads the primary's colo-compare counts. A QEMU that counts causes but does not
// hold unparsed packets reports no Unparsed or Held, and one without the crossed wait no Crossed.
func CompareCauses(ctx context.Context, q *qmp.Conn) (Causes, error) {
	var c Causes
	for _, r := range []struct {
		prop     string
		into     *uint64
		optional bool
	}{{propOnMismatch, &c.Mismatch, false}, {propOnTimeout, &c.Timeout, false}, {propOnUnparsed, &c.Unparsed, true}, {propUnparsedHeld, &c.Held, true}, {propOnCrossed, &c.Crossed, true}} {
		if err := q.Execute(ctx, "qom-get", map[string]any{"path": compareObject, "property": r.prop}, r.into); err != nil {
			var qe *qmp.Error
			notFound := errors.As(err, &qe) && strings.Contains(qe.Desc, "Property") && strings.Contains(qe.Desc, "not found")
			switch {
			case notFound && r.optional:
				continue
			case notFound:
				return Causes{}, errNoCauses
			}
			return Causes{}, err
		}
	}
	return c, nil
}

// causeCounts are the engine's counts of colo-compare's causes, over the side's life.
type causeCounts struct {
	unknown bool   // the QEMU does not count them
	life    Causes // over the side's life
	seen    Causes // what the current compare object said last
}

// add takes in what the current compare object counts: its counts start at zero with each
// protection (newProtection), so what is new is what grew since the last read.
func (c *causeCounts) add(now Causes) {
	grown := func(life *uint64, now, seen uint64) {
		if now >= seen {
			*life += now - seen
		}
	}
	grown(&c.life.Mismatch, now.Mismatch, c.seen.Mismatch)
	grown(&c.life.Timeout, now.Timeout, c.seen.Timeout)
	grown(&c.life.Unparsed, now.Unparsed, c.seen.Unparsed)
	grown(&c.life.Crossed, now.Crossed, c.seen.Crossed)
	grown(&c.life.Held, now.Held, c.seen.Held)
	c.seen = now
}

// newProtection forgets the last compare object's counts: the next one counts from zero.
func (c *causeCounts) newProtection() { c.seen = Causes{} }

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
	causes, err := CompareCauses(ctx, q)
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case errors.Is(err, errNoCauses):
		e.causes.unknown = true
		e.cfg.Log.Info("checkpoints are not told apart by cause", "reason", err.Error())
	case err == nil && e.protected:
		e.causes.add(causes)
	}
}
