package lockstepd

import (
	"encoding/json"
	"maps"
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/agent"
	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/failover"
)

// TestSideStatesAreTheAPIs checks that every failover state is reported under a name the CRD
// accepts (report writes State.String()).
func TestSideStatesAreTheAPIs(t *testing.T) {
	api := map[ftv1.SideState]bool{ftv1.SideProtected: true, ftv1.SideReplicating: true, ftv1.SideClaiming: true, ftv1.SideAlone: true, ftv1.SideFenced: true, ftv1.SideLapsed: true}
	for s := failover.Protected; s <= failover.Lapsed; s++ {
		if !api[ftv1.SideState(s.String())] {
			t.Errorf("failover state %s has no SideState", s)
		}
	}
}

func TestLogRates(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	every := 4 * time.Second
	protected := agent.Status{State: failover.Protected, BytesLogged: 1000, Checkpoints: 10, ForcedCheckpoints: 4, CheckpointPause: 20 * time.Millisecond}
	window := rateWindow{at: t0, from: protected}
	later := func(bytes, cps, forced uint64) agent.Status {
		st := protected
		st.BytesLogged, st.Checkpoints, st.ForcedCheckpoints, st.CheckpointPause = bytes, cps, forced, 15*time.Millisecond
		return st
	}
	withCauses := func(st agent.Status, mismatch, timeout, unparsed, crossed uint64) agent.Status {
		st.CheckpointCausesKnown, st.CheckpointsOnMismatch, st.CheckpointsOnTimeout, st.CheckpointsOnUnparsed, st.CheckpointsOnCrossed = true, mismatch, timeout, unparsed, crossed
		return st
	}
	alone := agent.Status{State: failover.Alone, BytesLogged: 5000}
	for _, tc := range []struct {
		name     string
		w        rateWindow
		st       agent.Status
		after    time.Duration
		want     string // the fields as JSON
		restarts bool   // the next window starts now
	}{
		{name: "the first report starts a window and clears the rates", st: protected,
			want: `{"checkpoints":{"crossedPerSecond":null,"forcedPerSecond":null,"mismatchPerSecond":null,"pauseMilliseconds":20,"perSecond":null,"timeoutPerSecond":null,"unparsedPerSecond":null},"logBandwidth":null}`, restarts: true},
		{name: "a whole window: the rates over it", w: window, st: later(21000, 30, 9), after: 4 * time.Second, want: `{"checkpoints":{"crossedPerSecond":null,"forcedPerSecond":"1250m","mismatchPerSecond":null,"pauseMilliseconds":15,"perSecond":"5","timeoutPerSecond":null,"unparsedPerSecond":null},"logBandwidth":"5k"}`, restarts: true},
		{name: "a longer window", w: window, st: later(11000, 20, 4), after: 10 * time.Second, want: `{"checkpoints":{"crossedPerSecond":null,"forcedPerSecond":"0","mismatchPerSecond":null,"pauseMilliseconds":15,"perSecond":"1","timeoutPerSecond":null,"unparsedPerSecond":null},"logBandwidth":"1k"}`, restarts: true},
		{name: "causes told apart: each a second", w: rateWindow{at: t0, from: withCauses(protected, 1, 2, 1, 0)}, st: withCauses(later(21000, 30, 9), 3, 3, 2, 1), after: 4 * time.Second,
			want: `{"checkpoints":{"crossedPerSecond":"250m","forcedPerSecond":"1250m","mismatchPerSecond":"500m","pauseMilliseconds":15,"perSecond":"5","timeoutPerSecond":"250m","unparsedPerSecond":"250m"},"logBandwidth":"5k"}`, restarts: true},
		{name: "a report inside the window (another field changed): the last rates stay", w: window, st: later(1000, 10, 4), after: time.Second,
			want: `{"checkpoints":{"pauseMilliseconds":15}}`},
		{name: "a new state starts a window: a primary's initial copy is not its protected bandwidth", w: rateWindow{at: t0, from: alone}, st: later(900000, 12, 4), after: time.Minute,
			want: `{"checkpoints":{"crossedPerSecond":null,"forcedPerSecond":null,"mismatchPerSecond":null,"pauseMilliseconds":15,"perSecond":null,"timeoutPerSecond":null,"unparsedPerSecond":null},"logBandwidth":null}`, restarts: true},
		{name: "counts that went back (a new engine) start a window", w: window, st: later(10, 2, 0), after: time.Minute,
			want: `{"checkpoints":{"crossedPerSecond":null,"forcedPerSecond":null,"mismatchPerSecond":null,"pauseMilliseconds":15,"perSecond":null,"timeoutPerSecond":null,"unparsedPerSecond":null},"logBandwidth":null}`, restarts: true},
		{name: "an engine without checkpoints: the bandwidth alone", w: rateWindow{at: t0, from: alone}, st: agent.Status{State: failover.Alone, BytesLogged: 5000}, after: every,
			want: `{"logBandwidth":"0"}`, restarts: true},
	} {
		now := t0.Add(tc.after)
		fields, next := logRates(tc.w, tc.st, now, every)
		got, err := json.Marshal(fields)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
		if restarted := next.at.Equal(now) && reflect.DeepEqual(next.from, tc.st); restarted != tc.restarts {
			t.Errorf("%s: the next window restarts: %v, want %v", tc.name, restarted, tc.restarts)
		}
	}
}

func TestCheckpointCauses(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   agent.Status
		want map[string]uint64
	}{
		{name: "a QEMU that does not say why: periodic and forced", st: agent.Status{Checkpoints: 10, ForcedCheckpoints: 4},
			want: map[string]uint64{"periodic": 6, "forced": 4}},
		{name: "causes told apart", st: agent.Status{Checkpoints: 10, ForcedCheckpoints: 8, CheckpointCausesKnown: true, CheckpointsOnMismatch: 2, CheckpointsOnTimeout: 4, CheckpointsOnUnparsed: 1, CheckpointsOnCrossed: 1},
			want: map[string]uint64{"periodic": 2, "mismatch": 2, "timeout": 4, "unparsed": 1, "crossed": 1}},
		{name: "more forced than counted (counted apart, in flight): no negative periodic", st: agent.Status{Checkpoints: 3, ForcedCheckpoints: 5},
			want: map[string]uint64{"periodic": 0, "forced": 5}},
	} {
		if got := checkpointCauses(tc.st); !maps.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestResyncStatus: no resync, no status (the merge patch removes it); one under way reports
// what is copied of what there is, its mean rate and when it catches up at that rate.
func TestResyncStatus(t *testing.T) {
	now := time.Date(2026, 11, 26, 7, 0, 0, 0, time.UTC)
	if rs := resyncStatus(engine.Resync{}, now); rs != nil {
		t.Fatalf("no resync: %+v", rs)
	}
	if b, _ := json.Marshal(map[string]any{"resync": resyncStatus(engine.Resync{}, now)}); string(b) != `{"resync":null}` {
		t.Fatalf("no resync patches %s, want null", b)
	}
	rs := resyncStatus(engine.Resync{Started: now.Add(-10 * time.Second), Done: 1 << 30, Total: 3 << 30}, now)
	if rs == nil || *rs.DoneBytes != 1<<30 || *rs.TotalBytes != 3<<30 || !rs.StartTime.Time.Equal(now.Add(-10*time.Second)) {
		t.Fatalf("under way: %+v", rs)
	}
	if rs.BytesPerSecond == nil || rs.BytesPerSecond.Value() != (1<<30)/10 {
		t.Errorf("rate %v, want %d", rs.BytesPerSecond, (1<<30)/10)
	}
	if rs.EstimatedCompletionTime == nil || !rs.EstimatedCompletionTime.Time.Equal(now.Add(20*time.Second)) {
		t.Errorf("caught up at %v, want %v", rs.EstimatedCompletionTime, now.Add(20*time.Second))
	}
	if rs := resyncStatus(engine.Resync{Started: now}, now); rs == nil || rs.BytesPerSecond != nil || rs.EstimatedCompletionTime != nil {
		t.Errorf("just started: %+v, want no rate yet", rs)
	}
}

// TestLastResyncStatus: none before the first (the merge patch removes an old one); then the
// secondary, whether it was incremental, the bytes and how long it took.
func TestLastResyncStatus(t *testing.T) {
	if b, _ := json.Marshal(map[string]any{"lastResync": lastResyncStatus(engine.ResyncDone{})}); string(b) != `{"lastResync":null}` {
		t.Fatalf("no resync yet patches %s, want null", b)
	}
	at := time.Date(2026, 11, 26, 7, 0, 0, 400_000_000, time.UTC)
	got := lastResyncStatus(engine.ResyncDone{Member: "vm-3", Incremental: true, Bytes: 1 << 20, Took: 1234567 * time.Microsecond, At: at})
	if got.Secondary != "vm-3" || !*got.Incremental || *got.CopiedBytes != 1<<20 || *got.DurationMilliseconds != 1235 ||
		!got.CompletionTime.Time.Equal(at.Truncate(time.Second)) {
		t.Fatalf("got %+v", got)
	}
}

// A pair whose reconcile failed for as long as an API server outage lasts is retried within
// retryCap of the API server's return, not after controller-runtime's default backoff (which
// doubles up to 1000 s): a fenced member's VMI is deleted, and the operator replaces it, soon after.
func TestAPairIsRetriedWithinRetryCapAfterALongOutage(t *testing.T) {
	l := retryLimiter()
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "vm"}}
	var last time.Duration
	for range 40 { // 40 failed attempts: far more than a 30 s outage makes
		last = l.When(req)
	}
	if last > retryCap || last < retryCap/2 {
		t.Fatalf("after 40 failures a pair is retried in %s, want at most %s (and backing off to it)", last, retryCap)
	}
	l.Forget(req)
	if first := l.When(req); first > 100*time.Millisecond {
		t.Fatalf("a pair that succeeded and then failed once is retried in %s", first)
	}
}
