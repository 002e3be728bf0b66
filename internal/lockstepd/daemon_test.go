package lockstepd

import (
	"testing"
	"time"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/agent"
	"github.com/lockstep-dev/lockstep/internal/failover"
)

// TestSideStatesAreTheAPIs checks that every failover state is reported under a name the CRD
// accepts (report writes State.String()).
func TestSideStatesAreTheAPIs(t *testing.T) {
	api := map[ftv1.SideState]bool{ftv1.SideProtected: true, ftv1.SideReplicating: true, ftv1.SideClaiming: true, ftv1.SideAlone: true, ftv1.SideFenced: true}
	for s := failover.Protected; s <= failover.Fenced; s++ {
		if !api[ftv1.SideState(s.String())] {
			t.Errorf("failover state %s has no SideState", s)
		}
	}
}

func TestCheckpointStatus(t *testing.T) {
	prev := agent.Status{Checkpoints: 10, ForcedCheckpoints: 4}
	for _, tc := range []struct {
		name              string
		st                agent.Status
		elapsed           time.Duration
		hadReport         bool
		wantNil           bool
		perSecond, forced string
		wantPause         time.Duration
	}{
		{name: "an engine without checkpoints", st: agent.Status{}, elapsed: time.Second, hadReport: true, wantNil: true},
		{name: "the first report: the pause, no rates", st: agent.Status{Checkpoints: 3, CheckpointPause: 20 * time.Millisecond}, wantPause: 20 * time.Millisecond},
		{name: "rates since the last report", st: agent.Status{Checkpoints: 30, ForcedCheckpoints: 9, CheckpointPause: 15 * time.Millisecond},
			elapsed: 4 * time.Second, hadReport: true, perSecond: "5", forced: "1250m", wantPause: 15 * time.Millisecond},
		{name: "counts that went back (a new engine): no rates", st: agent.Status{Checkpoints: 2, CheckpointPause: 1500 * time.Microsecond},
			elapsed: time.Second, hadReport: true, wantPause: time.Millisecond},
	} {
		got := checkpointStatus(tc.st, prev, tc.elapsed, tc.hadReport)
		if tc.wantNil {
			if got != nil {
				t.Errorf("%s: %+v, want none", tc.name, got)
			}
			continue
		}
		if got == nil || got.PauseMilliseconds == nil || time.Duration(*got.PauseMilliseconds)*time.Millisecond != tc.wantPause {
			t.Fatalf("%s: %+v, want a pause of %s", tc.name, got, tc.wantPause)
		}
		rate := func(q interface{ String() string }, isNil bool) string {
			if isNil {
				return ""
			}
			return q.String()
		}
		if p, f := rate(got.PerSecond, got.PerSecond == nil), rate(got.ForcedPerSecond, got.ForcedPerSecond == nil); p != tc.perSecond || f != tc.forced {
			t.Errorf("%s: %q and %q a second, want %q and %q", tc.name, p, f, tc.perSecond, tc.forced)
		}
	}
}
