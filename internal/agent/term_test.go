package agent_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/failover"
	"github.com/lockstep-dev/lockstep/internal/term"
	"github.com/lockstep-dev/lockstep/test/vmdouble"
)

// The record's term (term.go): a side cut from the record pauses its VM before its term ends,
// runs again when a renewal goes through, and is fenced when the record moved on meanwhile.

// Renews every 1.2s, pauses 5s after the last renewal (then tries every 200ms), stops at 6s.
const testTerm = term.Term(6 * time.Second)

// cutUntilLapsed cuts side name from the record, waits until it lapsed, and checks that it
// paused its VM after the holder's margin began and before the term ended, counting from the
// last renewal that went through, and that nothing leaves it while it is paused.
func (p *pair) cutUntilLapsed(t *testing.T, s *side, name string) {
	t.Helper()
	p.lease.SetDownFor(name, true)
	waitState(t, s, failover.Lapsed)
	st := s.agent.Status()
	if st.RenewedAt.IsZero() || st.Lapses == 0 {
		t.Fatalf("%s lapsed without a renewal or a count: %+v", name, st)
	}
	// The side is Lapsed as it decides to pause: the pause follows, and must come before the
	// term ends.
	for !s.engine.Paused() {
		if time.Now().After(st.RenewedAt.Add(time.Duration(testTerm))) {
			t.Fatalf("%s lapsed and its VM still ran when its term ended", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st.Since.Before(testTerm.PauseAt(st.RenewedAt)) {
		t.Fatalf("%s paused %s after its last renewal, before its margin (%s)", name, st.Since.Sub(st.RenewedAt), testTerm.PauseAt(st.RenewedAt).Sub(st.RenewedAt))
	}
	if end := st.RenewedAt.Add(time.Duration(testTerm)); !st.Since.Before(end) {
		t.Fatalf("%s paused %s after its last renewal: after its term of %s", name, st.Since.Sub(st.RenewedAt), time.Duration(testTerm))
	}
	_, before, _ := p.outs.snapshot()
	time.Sleep(200 * time.Millisecond)
	_, after, err := p.outs.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if after[name] != before[name] {
		t.Fatalf("%s released outputs %d to %d while lapsed", name, before[name], after[name])
	}
}

func TestAnAlonePrimaryCutFromTheRecordPausesAndRunsAgainWhenItRenews(t *testing.T) {
	p := newPair(t)
	p.term = testTerm
	a := p.start(t, "a", true, p.tlsA, nil)
	waitState(t, a, failover.Alone)
	deadline := time.Now().Add(10 * time.Second)
	for p.lease.Renewals("a") < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the alone primary does not renew the record")
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.cutUntilLapsed(t, a, "a")

	// The cut heals: the next renewal goes through, the VM runs and releases again.
	_, before, _ := p.outs.snapshot()
	p.lease.SetDownFor("a", false)
	waitState(t, a, failover.Alone)
	deadline = time.Now().Add(10 * time.Second)
	for {
		_, now, err := p.outs.snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if now["a"] > before["a"]+10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no output after the renewal: %d, was %d (engine paused: %v)", now["a"], before["a"], a.engine.Paused())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if a.engine.Paused() || a.agent.Status().Epoch != 2 {
		t.Fatalf("after the renewal: paused %v, %+v", a.engine.Paused(), a.agent.Status())
	}

	// Cut again; meanwhile the operator gives the record to a new member (the term passed):
	// the renewal after the heal finds it moved, and the side is fenced for good.
	p.cutUntilLapsed(t, a, "a")
	p.lease.Hold("node-x/x", 3)
	_, before, _ = p.outs.snapshot()
	p.lease.SetDownFor("a", false)
	waitState(t, a, failover.Fenced)
	time.Sleep(100 * time.Millisecond)
	_, after, _ := p.outs.snapshot()
	if after["a"] != before["a"] {
		t.Fatalf("a released outputs %d to %d after the record moved", before["a"], after["a"])
	}
}

// A protected primary cut from the API server, whose secondary is not, runs on: its secondary
// renews the record for it and tells it so. The operator sees the renewals and waits.
func TestAProtectedPrimaryCutFromTheRecordRunsOnWhileItsSecondaryRenewsForIt(t *testing.T) {
	p := newPair(t)
	p.term = testTerm
	p.protect(t)
	p.lease.SetDownFor("a", true)
	_, before, _ := p.outs.snapshot()
	time.Sleep(2 * time.Duration(testTerm))
	st := p.a.agent.Status()
	if st.State != failover.Protected || st.Lapses != 0 {
		t.Fatalf("a protected primary cut from the record for two terms, its secondary renewing: %s, %d lapses", st.State, st.Lapses)
	}
	_, after, err := p.outs.snapshot()
	if err != nil {
		t.Fatal(err) // and every output still left only once the secondary held it
	}
	if after["a"] <= before["a"] || p.lease.Renewals("b") == 0 {
		t.Fatalf("outputs %d to %d, the secondary's renewals %d", before["a"], after["a"], p.lease.Renewals("b"))
	}
}

// Cut from the record with its secondary, a protected primary pauses; the cut heals, it resumes.
func TestAProtectedPrimaryCutFromTheRecordWithItsSecondaryPausesAndResumesProtected(t *testing.T) {
	p := newPair(t)
	p.term = testTerm
	p.protect(t)
	p.lease.SetDownFor("b", true)
	p.cutUntilLapsed(t, p.a, "a")
	if st := p.b.agent.State(); st != failover.Replicating {
		t.Fatalf("the secondary of a paused primary is %s: its lockstepd still answers", st)
	}
	p.lease.SetDownFor("a", false)
	p.lease.SetDownFor("b", false)
	waitState(t, p.a, failover.Protected)
	_, before, _ := p.outs.snapshot()
	time.Sleep(200 * time.Millisecond)
	_, after, err := p.outs.snapshot()
	if err != nil {
		t.Fatal(err) // every output still left only once the secondary held it
	}
	if after["a"] <= before["a"] {
		t.Fatalf("no output after the protected primary renewed: %d", after["a"])
	}
}

// Paused until its term runs out (internal/term's StopAt) without a renewal, a side stops its VM,
// which would otherwise keep the VM's disks from the copy the operator starts elsewhere; not before.
func TestALapsedSideWhoseTermRunsOutIsStopped(t *testing.T) {
	p := newPair(t)
	p.term = testTerm
	a := p.start(t, "a", true, p.tlsA, nil)
	waitState(t, a, failover.Alone)
	p.cutUntilLapsed(t, a, "a")
	waitState(t, a, failover.Fenced)
	st := a.agent.Status()
	if end := testTerm.StopAt(st.RenewedAt); st.Since.Before(end) {
		t.Fatalf("stopped %s after its last renewal, before its term (%s) ran out", st.Since.Sub(st.RenewedAt), time.Duration(testTerm))
	}
	if !strings.Contains(st.Message, "of its term") {
		t.Fatalf("fenced with %q, want it to say its term ended", st.Message)
	}
}

// An engine without Pauser cannot hold its VM: its side is fenced when its term lapses.
func TestASideThatCannotPauseIsFencedWhenItsTermLapses(t *testing.T) {
	p := newPair(t)
	p.term = testTerm
	// The wrapper hides every method but the Engine's.
	p.wrap = map[string]func(*vmdouble.Counter) engine.Engine{"a": func(c *vmdouble.Counter) engine.Engine {
		return struct{ engine.Engine }{c}
	}}
	a := p.start(t, "a", true, p.tlsA, nil)
	waitState(t, a, failover.Alone)
	p.lease.SetDownFor("a", true)
	waitState(t, a, failover.Fenced)
	if msg := a.agent.Status().Message; !strings.Contains(msg, "cannot pause") {
		t.Fatalf("fenced with %q, want it to say the engine cannot pause", msg)
	}
}

// A restarting primary is often the only copy of the VM: a record it cannot read at once (the
// API server restarting too) must not stop it.
func TestAStartingPrimaryReadsTheRecordAgainRatherThanStopAtTheFirstFailure(t *testing.T) {
	p := newPair(t)
	p.lease.SetDown(true)
	a := p.start(t, "a", true, p.tlsA, nil)
	time.Sleep(150 * time.Millisecond) // within its claim timeout (300ms)
	if st := a.agent.State(); st == failover.Fenced {
		t.Fatalf("fenced after one failed read: %s", a.agent.Status().Message)
	}
	p.lease.SetDown(false)
	waitState(t, a, failover.Alone)
}

// A protected primary whose secondary goes silent while the API server does not answer keeps
// claiming, its outputs held, until its term's stop point rather than its claim timeout: the
// operator cannot move the record before then, and stopping sooner would stop the only live copy
// of the VM for an API server that was slow for a few seconds (the operator replacing a
// secondary, an API server restarting). Past the stop point it is stopped, as a lapsed side is.
func TestAPrimaryClaimingFromItsSilentSecondaryTriesUntilItsTermStops(t *testing.T) {
	for _, heals := range []bool{true, false} {
		t.Run(fmt.Sprintf("the API server answers again %v", heals), func(t *testing.T) {
			p := newPair(t)
			p.term = testTerm
			p.protect(t)
			p.lease.SetDownFor("a", true)
			p.b.cancel() // the secondary goes silent: a claims
			waitState(t, p.a, failover.Claiming)
			time.Sleep(4 * 300 * time.Millisecond) // four claim timeouts
			if st := p.a.agent.Status(); st.State != failover.Claiming {
				t.Fatalf("after four claim timeouts without the API server: %s (%s), want still claiming", st.State, st.Message)
			}
			_, before, _ := p.outs.snapshot()
			time.Sleep(100 * time.Millisecond)
			if _, after, _ := p.outs.snapshot(); after["a"] != before["a"] {
				t.Fatalf("a released outputs %d to %d while claiming", before["a"], after["a"])
			}
			if heals {
				p.lease.SetDownFor("a", false)
				waitState(t, p.a, failover.Alone)
				if h := p.lease.Holder(); h.Identity != "a" || h.Epoch != 3 {
					t.Fatalf("the record after the claim: %+v, want a at epoch 3", h)
				}
				return
			}
			waitState(t, p.a, failover.Fenced)
			st := p.a.agent.Status()
			if stop := testTerm.StopAt(st.RenewedAt); st.Since.Before(stop) {
				t.Fatalf("stopped %s after its last renewal, before its term's stop point (%s)", st.Since.Sub(st.RenewedAt), stop.Sub(st.RenewedAt))
			}
		})
	}
}
