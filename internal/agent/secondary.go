package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/lockstep-dev/lockstep/internal/channel"
	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/failover"
)

func (a *Agent) startSecondary(ctx context.Context) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sec = channel.NewSecondary(a.cfg.Channel, a.vm.Apply)
	a.sec.OnSynchronized = a.changed
	// The renewals of the record this side made for its primary reach the primary (term.go).
	a.sec.Witness = func() time.Time {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.witnessedAt
	}
	// A primary that resigned stopped running the VM: a synchronized secondary claims the pair
	// at once, as it would after the detection timeout.
	a.sec.OnResign = func(reason string) {
		go a.post(ctx, func() {
			if a.State() == failover.Replicating && a.synchronized() {
				a.on(ctx, failover.PeerSilent, "the primary resigned: "+reason)
			}
		})
	}
	a.mux.Register(a.cfg.Pair, a.sec)
	if w, ok := a.vm.(engine.Watcher); ok {
		go a.watchVM(ctx, w.Exited())
	}
}

// watchVM fences the side once its VM is gone. A secondary's log channel would otherwise go on
// acknowledging the primary's entries with no VM behind them, and a COLO primary would hold the
// VM's output for good, waiting on checkpoints that no one loads. (A side that runs the VM learns
// it from the engine's Run, which fences it the same way.)
func (a *Agent) watchVM(ctx context.Context, exited <-chan struct{}) {
	if exited == nil {
		return
	}
	select {
	case <-ctx.Done():
	case <-exited:
		a.post(ctx, func() {
			if a.State() != failover.Fenced && ctx.Err() == nil {
				a.fence("the member's VM exited")
			}
		})
	}
}

// synchronized says whether the side, as a secondary, holds the state of its primary's newest
// epoch (channel.Secondary.Synchronized): only then may it claim the pair or be promoted.
func (a *Agent) synchronized() bool {
	a.mu.Lock()
	sec := a.sec
	a.mu.Unlock()
	return sec != nil && sec.Synchronized()
}

// checkSilence is the failure detector: a protected primary or a synchronized secondary that has
// not heard its peer for Detect claims the Lease.
func (a *Agent) checkSilence(ctx context.Context, now time.Time) {
	a.mu.Lock()
	state, sec, out := a.side.State, a.sec, a.out
	a.mu.Unlock()
	synced := sec != nil && sec.Synchronized()
	var silence time.Duration
	switch {
	case state == failover.Protected && out != nil:
		silence = now.Sub(out.p.Stats().LastHeard)
	case state == failover.Replicating && synced && sec != nil:
		silence = sec.Silence(now)
	default:
		return
	}
	if silence > a.cfg.Detect {
		a.on(ctx, failover.PeerSilent, fmt.Sprintf("the peer was silent for %s", silence.Round(time.Millisecond)))
	}
}
