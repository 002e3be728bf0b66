package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/failover"
)

func (a *Agent) startPrimary(ctx context.Context) {
	// A restarted lockstepd's primary may be the only copy of the VM: one failed read of the
	// record must not stop it. It tries for as long as a claim would.
	holder, err := ensureWithin(ctx, a.arb, a.cfg.ClaimTimeout)
	if err != nil {
		a.fence(fmt.Sprintf("could not read the pair's Lease within %s: %v", a.cfg.ClaimTimeout, err))
		return
	}
	if holder.Identity != "" && !holder.Self {
		// The record names another member: the VM runs there (a secondary went live while this
		// side's lockstepd was away), or is about to. Claiming would take it from that member.
		a.on(ctx, failover.ClaimLost, fmt.Sprintf("the pair's record names %s at epoch %d, not this member", holder.Identity, holder.Epoch))
		return
	}
	// A new primary always takes a new epoch: an older primary of the pair, if any still runs,
	// is fenced by it.
	a.claim(ctx, holder.Epoch)
}

// claimFromPeer stops following or streaming to the silent peer and claims the epoch after the
// newest one this side knows: the one it holds, or the one its primary's log carried.
func (a *Agent) claimFromPeer(ctx context.Context) {
	a.mu.Lock()
	known, sec := a.epoch, a.sec
	if a.side.WasPrimary && a.out != nil {
		a.dropped = a.out.peer.VMI
	}
	a.mu.Unlock()
	if sec != nil {
		// Apply nothing more: this side may go live from what it has. Close waits for an entry
		// being applied, whose apply takes a.mu: it must not be held here.
		sec.Close()
		a.mux.Unregister(a.cfg.Pair, sec)
		// A secondary that went live keeps its old log, whose epoch is older than the one it won:
		// claiming from that would find its own Lease and "win" the epoch it already holds, while
		// its new secondary, which knows that epoch, wins the next one (two live sides).
		known = max(known, sec.Epoch())
	}
	a.dropChannel()
	a.claim(ctx, known)
}

// claim asks the arbiter for the epoch after known, retrying until the claim's deadline
// (claimTimeout), and feeds the answer to the loop.
func (a *Agent) claim(ctx context.Context, known uint64) {
	a.mu.Lock()
	if a.claiming {
		a.mu.Unlock()
		return
	}
	a.claiming = true
	started := time.Now()
	timeout := a.claimTimeout(started)
	a.mu.Unlock()
	go func() {
		epoch, err := claimWithin(ctx, a.arb, known, timeout)
		a.post(ctx, func() {
			a.mu.Lock()
			a.claiming = false
			if err == nil {
				a.epoch = epoch
				a.claimed(started)
			}
			a.mu.Unlock()
			switch {
			case err == nil:
				a.on(ctx, failover.ClaimWon, fmt.Sprintf("won the pair's Lease at epoch %d", epoch))
			case errors.Is(err, engine.ErrLost):
				a.on(ctx, failover.ClaimLost, err.Error())
			default:
				a.on(ctx, failover.ClaimFailed, fmt.Sprintf("could not reach the arbiter within %s: %v", timeout.Round(time.Millisecond), err))
			}
		})
	}()
}

// claimTimeout is how long a claim started at now may try. A primary that claims from its
// secondary (silent, or dropped as the operator replaces it) still holds the record's term: the
// operator moves the record only once the term has passed since the last renewal it saw, and this
// side releases nothing while it claims. It may try until its term's stop point, so that an API
// server slower than ClaimTimeout for a while does not stop the only live copy of the VM; a side
// without a term (a secondary, a primary that has not renewed yet) has ClaimTimeout. Called
// with a.mu held.
func (a *Agent) claimTimeout(now time.Time) time.Duration {
	timeout := a.cfg.ClaimTimeout
	if a.cfg.Term > 0 && a.side.WasPrimary && a.epoch > 0 && !a.renewedAt.IsZero() {
		timeout = max(timeout, a.cfg.Term.StopAt(a.renewedAt).Sub(now))
	}
	return timeout
}

// ensureWithin reads the record (creating it when there is none) until a read goes through or
// timeout passes.
func ensureWithin(ctx context.Context, arb engine.Arbiter, timeout time.Duration) (engine.Holder, error) {
	return retryWithin(ctx, timeout, arb.Ensure, func(error) bool { return false })
}

// claimWithin claims the record until the arbiter decides (won, or ErrLost) or timeout passes.
func claimWithin(ctx context.Context, arb engine.Arbiter, known uint64, timeout time.Duration) (uint64, error) {
	claim := func(ctx context.Context) (uint64, error) { return arb.Claim(ctx, known) }
	return retryWithin(ctx, timeout, claim, func(err error) bool { return errors.Is(err, engine.ErrLost) })
}

// retryWithin calls try every 100 ms until it succeeds, fails with an error final says is an
// answer, or timeout passes (then it returns the last error): an API server that answers slowly
// or not at all is asked again rather than taken for a loss.
func retryWithin[T any](ctx context.Context, timeout time.Duration, try func(context.Context) (T, error), final func(error) bool) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		v, err := try(ctx)
		if err == nil || final(err) {
			return v, err
		}
		select {
		case <-ctx.Done():
			var zero T
			return zero, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// DropSecondary implements engine.Recorder: a primary claims the pair from a secondary that its
// engine can no longer keep in step, and waits for the claim's answer. That is a protected
// primary, and an alone one that has begun a log to a secondary: what it logged there may already
// have made the secondary synchronized at this epoch (the engine's "ready"), before its
// acknowledgement made the pair Protected. A side already claiming waits for its claim; an alone
// one without a log out has no secondary that took its epoch's state.
func (a *Agent) DropSecondary(ctx context.Context, why string) error {
	type start struct {
		state   failover.State
		epoch   uint64
		claimed bool
	}
	started := make(chan start, 1)
	a.post(ctx, func() {
		a.mu.Lock()
		st := start{state: a.side.State, epoch: a.epoch}
		st.claimed = st.state == failover.Protected || st.state == failover.Alone && a.out != nil
		a.mu.Unlock()
		if st.claimed {
			a.on(ctx, failover.SecondaryDropped, why)
		}
		started <- st
	})
	var from start
	select {
	case from = <-started:
	case <-a.stopped:
		// (The loop ended before it ran the question: the side was fenced, or lockstepd stops.)
		return engine.ErrFenced
	case <-ctx.Done():
		return ctx.Err()
	}
	switch {
	case from.claimed || from.state == failover.Claiming:
	case from.state == failover.Alone:
		return nil
	case from.state == failover.Fenced:
		return engine.ErrFenced
	default:
		return fmt.Errorf("a side in state %s has no secondary to drop", from.state)
	}
	for {
		a.mu.Lock()
		state, epoch := a.side.State, a.epoch
		a.mu.Unlock()
		switch {
		case state == failover.Fenced:
			return engine.ErrFenced
		case state != failover.Claiming && epoch > from.epoch:
			return nil // won (the agent may already be protected again by a new secondary)
		}
		select {
		case <-ctx.Done():
			if a.State() == failover.Fenced {
				return engine.ErrFenced
			}
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
