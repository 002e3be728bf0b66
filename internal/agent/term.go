package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/failover"
)

// The pair's record as a lease with a term (internal/term). A side that runs the VM renews it
// every RenewEvery; one whose last renewal that went through is older than the term less its
// margin pauses its VM and releases nothing (failover.Lapsed) until a renewal goes through again,
// so that the operator, which waits out the term on its own clock before it starts the VM
// elsewhere, never finds it running.
//
// A synchronized secondary that hears its primary renews the primary's record too, and tells the
// primary over the log channel (ftlog.Renewed): a primary cut from the API server but not from
// its secondary keeps its term and runs on, protected. Cut from both, it pauses like any other:
// its secondary would otherwise go on acknowledging its outputs after the operator restarted the
// VM elsewhere.

// renewal is what one renewal renews: the record naming member at epoch.
type renewal struct {
	epoch  uint64
	member string
	holder bool
}

// checkTerm pauses a holder whose term lapsed and starts the renewal that is due.
func (a *Agent) checkTerm(ctx context.Context, now time.Time) {
	t := a.cfg.Term
	if t <= 0 {
		return
	}
	a.mu.Lock()
	st, renewed := a.side.State, a.renewedAt
	// A secondary renews for its primary less often: it matters only while the primary cannot,
	// and each renewal is a write to the API server (two a pair, every few seconds).
	every := t.RenewEvery()
	switch st {
	case failover.Replicating:
		every = t.WitnessEvery()
	case failover.Lapsed:
		// Paused, it has a twelfth of the term to find the API server back before its VM is
		// stopped: it tries several times in it.
		every = t.HolderMargin() / 5
	}
	due := !a.renewing && now.Sub(a.renewTried) >= every
	a.mu.Unlock()
	switch {
	case (st == failover.Protected || st == failover.Alone) && t.Lapsed(renewed, now):
		a.mu.Lock()
		a.lapses++
		a.mu.Unlock()
		a.on(ctx, failover.TermLapsed, fmt.Sprintf("could not renew the pair's record for %s (term %s): the VM is paused until a renewal goes through",
			now.Sub(renewed).Round(time.Millisecond), time.Duration(t)))
	case st == failover.Lapsed && t.Ended(renewed, now):
		a.on(ctx, failover.TermEnded, fmt.Sprintf("could not renew the pair's record for %s of its term (%s): the VM is stopped, and starts elsewhere",
			now.Sub(renewed).Round(time.Millisecond), time.Duration(t)))
	}
	if due {
		if r, ok := a.renewalDue(now); ok {
			a.renew(ctx, r, now)
		}
	}
}

// renewalDue is the renewal this side makes now, if any: a side that runs the VM renews its own;
// a synchronized secondary that hears its primary renews the primary's, and tells it so.
func (a *Agent) renewalDue(now time.Time) (renewal, bool) {
	a.mu.Lock()
	st, epoch, sec, peer := a.side.State, a.epoch, a.sec, a.peer.VMI
	a.mu.Unlock()
	switch {
	case st == failover.Protected || st == failover.Alone || st == failover.Lapsed:
		return renewal{epoch: epoch, member: memberOf(a.cfg.Identity), holder: true}, epoch > 0
	case st == failover.Replicating && sec != nil && peer != "":
		// (sec's methods take its own lock: not called under a.mu.)
		if !sec.Synchronized() || sec.Silence(now) > a.cfg.Detect || sec.Epoch() == 0 {
			return renewal{}, false // a silent primary is for the detector, not for a witness
		}
		return renewal{epoch: sec.Epoch(), member: peer}, true
	}
	return renewal{}, false
}

// renewedBySecondary takes the secondary's word that it renewed the record for this side, as a
// renewal of this side's own that began at began (the channel dates it no later than it began).
func (a *Agent) renewedBySecondary(oc *outChannel, began time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.out == oc && began.After(a.renewedAt) {
		a.renewedAt = began
	}
}

// renew runs one renewal in the background and feeds its answer to the loop.
func (a *Agent) renew(ctx context.Context, r renewal, started time.Time) {
	a.mu.Lock()
	a.renewing, a.renewTried = true, started
	a.mu.Unlock()
	go func() {
		rctx, cancel := context.WithTimeout(ctx, a.cfg.Term.RenewEvery())
		err := a.arb.Renew(rctx, r.epoch, r.member)
		cancel()
		a.post(ctx, func() { a.renewed(ctx, r, started, err) })
	}()
}

// renewed takes a renewal's answer. Only a holder still at the renewal's epoch acts on it: a
// claim may have moved this side to a newer one meanwhile.
func (a *Agent) renewed(ctx context.Context, r renewal, started time.Time, err error) {
	a.mu.Lock()
	a.renewing = false
	current := r.holder && a.epoch == r.epoch
	st := a.side.State
	if err == nil && current && started.After(a.renewedAt) {
		a.renewedAt = started
	}
	if err == nil && !r.holder && started.After(a.witnessedAt) {
		a.witnessedAt = started
	}
	a.renewErr = err
	a.mu.Unlock()
	switch {
	case err != nil && !errors.Is(err, engine.ErrLost):
		a.cfg.Log.Info("could not renew the pair's record", "for", r.member, "epoch", r.epoch, "err", err.Error())
	case !current:
	case err != nil:
		a.on(ctx, failover.RecordMoved, "renewing the pair's record: "+err.Error())
	case st == failover.Lapsed:
		a.on(ctx, failover.Renewed, fmt.Sprintf("renewed the pair's record at epoch %d", r.epoch))
	}
}

// claimed records a won claim as a renewal: the claim's write started at started.
func (a *Agent) claimed(started time.Time) {
	if started.After(a.renewedAt) {
		a.renewedAt = started
	}
}

// pause pauses the VM of a side whose term lapsed; a side whose engine cannot pause is fenced.
func (a *Agent) pause(ctx context.Context, why string) {
	p, ok := a.vm.(engine.Pauser)
	if !ok {
		a.fence(why + "; the engine cannot pause its VM, so it is stopped")
		return
	}
	pctx, cancel := context.WithTimeout(ctx, a.cfg.Term.HolderMargin())
	defer cancel()
	if err := p.Pause(pctx); err != nil {
		a.fence(fmt.Sprintf("%s; pausing the VM failed (%v), so it is stopped", why, err))
		return
	}
	a.cfg.Log.Info("paused the VM", "why", why)
}

// resume runs the VM of a side that renewed again; one that cannot run it is fenced.
func (a *Agent) resume(ctx context.Context) bool {
	p, ok := a.vm.(engine.Pauser)
	if !ok {
		return false // pause fenced it
	}
	if err := p.Resume(ctx); err != nil {
		a.fence(fmt.Sprintf("resuming the VM after the pair's record was renewed: %v", err))
		return false
	}
	a.cfg.Log.Info("resumed the VM: the pair's record was renewed")
	return true
}

// memberOf is the member VMI of identity "<node>/<vmi>".
func memberOf(identity string) string {
	if _, vmi, ok := strings.Cut(identity, "/"); ok {
		return vmi
	}
	return identity
}
