package failover

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestNeverTwoLiveSides runs both sides of a pair against a model of the Lease (a compare-and-set
// on an epoch) through random partitions of the logging link, random loss of the API server for
// either side, and claims that race or arrive late. At every step at most one side may release
// outputs on its own, a side that does holds the Lease's current epoch, and a fenced side stays
// fenced. And liveness: once the link is down, a side that reaches the arbiter ends up live.
func TestNeverTwoLiveSides(t *testing.T) {
	for seed := range uint64(2000) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 3))
			lease := uint64(1)
			sides := [2]Side{NewPrimary(), NewSecondary()}
			known := [2]uint64{1, 1} // the epoch each side last knew
			pending := [2]bool{}     // a claim under way
			apiOK := [2]bool{true, true}
			linkUp := true
			for step := range 60 {
				switch op := r.IntN(6); op {
				case 0:
					linkUp = !linkUp
				case 1:
					i := r.IntN(2)
					apiOK[i] = !apiOK[i]
				case 2, 3: // a side's detector fires: the link is down, or the peer is fenced
					i := r.IntN(2)
					ev := PeerSilent
					// (An Alone side drops only a new secondary, which the model does not have.)
					if linkUp && sides[i].State == Protected && r.IntN(2) == 0 {
						ev = SecondaryDropped // the primary's engine lost its secondary, which still answers
					}
					if !linkUp || sides[1-i].State == Fenced || ev == SecondaryDropped {
						acts, err := sides[i].On(ev)
						if err != nil {
							t.Fatal(err)
						}
						for _, a := range acts {
							if a == Claim {
								pending[i] = true
							}
						}
					}
				default: // a pending claim reaches the arbiter (or does not)
					i := r.IntN(2)
					if !pending[i] {
						continue
					}
					pending[i] = false
					var ev Event
					switch {
					case !apiOK[i]:
						ev = ClaimFailed
					case lease == known[i]:
						lease++
						known[i] = lease
						ev = ClaimWon
					default:
						ev = ClaimLost
					}
					if _, err := sides[i].On(ev); err != nil {
						t.Fatal(err)
					}
				}
				live := 0
				for i, s := range sides {
					if s.MayRelease() {
						live++
						if known[i] != lease {
							t.Fatalf("step %d: side %d releases on its own at epoch %d, the Lease is at %d", step, i, known[i], lease)
						}
					}
				}
				if live > 1 {
					t.Fatalf("step %d: both sides live: %+v", step, sides)
				}
			}
			// Liveness: the link stays down and the arbiter is reachable; unless both sides
			// already fenced themselves, exactly one ends up live.
			if sides[0].State == Fenced && sides[1].State == Fenced {
				return
			}
			for _, i := range r.Perm(2) {
				if _, err := sides[i].On(PeerSilent); err != nil {
					t.Fatal(err)
				}
				if sides[i].State != Claiming {
					continue
				}
				ev := ClaimLost
				if lease == known[i] {
					lease++
					known[i] = lease
					ev = ClaimWon
				}
				if _, err := sides[i].On(ev); err != nil {
					t.Fatal(err)
				}
			}
			if sides[0].MayRelease() == sides[1].MayRelease() {
				t.Fatalf("after the link stayed down: %+v", sides)
			}
		})
	}
}

func TestWhatEachSideDoes(t *testing.T) {
	for _, c := range []struct {
		name   string
		side   Side
		events []Event
		want   State
		acts   []Action
	}{
		{"secondary wins", NewSecondary(), []Event{PeerSilent, ClaimWon}, Alone, []Action{GoLive, ReleaseHeld, StartSecondary}},
		{"primary wins", NewPrimary(), []Event{PeerSilent, ClaimWon}, Alone, []Action{ReleaseHeld, StartSecondary}},
		{"primary loses", NewPrimary(), []Event{PeerSilent, ClaimLost}, Fenced, []Action{Fence}},
		{"no arbiter", NewSecondary(), []Event{PeerSilent, ClaimFailed}, Fenced, []Action{Fence}},
		{"re-protected", NewSecondary(), []Event{PeerSilent, ClaimWon, SecondaryJoined}, Protected, nil},
		{"fenced is final", NewPrimary(), []Event{PeerSilent, ClaimLost, PeerSilent}, Fenced, nil},
		{"primary drops its secondary", NewPrimary(), []Event{SecondaryDropped}, Claiming, []Action{Claim}},
		{"primary goes on without the secondary it dropped", NewPrimary(), []Event{SecondaryDropped, ClaimWon}, Alone, []Action{ReleaseHeld, StartSecondary}},
		{"an alone primary claims from the new secondary it logged to", NewPrimary(), []Event{PeerSilent, ClaimWon, SecondaryDropped}, Claiming, []Action{Claim}},
		{"a claiming primary is already claiming", NewPrimary(), []Event{PeerSilent, SecondaryDropped}, Claiming, nil},
		{"an alone side that cannot renew pauses", NewPrimary(), []Event{PeerSilent, ClaimWon, TermLapsed}, Lapsed, []Action{Pause}},
		{"a protected primary that cannot renew pauses", NewPrimary(), []Event{PeerSilent, ClaimWon, SecondaryJoined, TermLapsed}, Lapsed, []Action{Pause}},
		{"a lapsed alone side renewed runs and releases", NewPrimary(), []Event{PeerSilent, ClaimWon, TermLapsed, Renewed}, Alone, []Action{Resume, ReleaseHeld}},
		{"a lapsed protected primary renewed waits for acknowledgements", NewPrimary(), []Event{PeerSilent, ClaimWon, SecondaryJoined, TermLapsed, Renewed}, Protected, []Action{Resume, ReleaseAcked}},
		{"a lapsed side whose secondary joined before the lapse resumes protected", NewPrimary(), []Event{PeerSilent, ClaimWon, TermLapsed, SecondaryJoined, Renewed}, Protected, []Action{Resume, ReleaseAcked}},
		{"a lapsed side whose record moved is fenced", NewPrimary(), []Event{PeerSilent, ClaimWon, TermLapsed, RecordMoved}, Fenced, []Action{Fence}},
		{"a lapsed side whose term ran out is fenced", NewPrimary(), []Event{PeerSilent, ClaimWon, TermLapsed, TermEnded}, Fenced, []Action{Fence}},
		{"the end of a term fences only a lapsed side", NewPrimary(), []Event{PeerSilent, ClaimWon, TermEnded}, Alone, nil},
		{"a running side whose record moved is fenced", NewPrimary(), []Event{PeerSilent, ClaimWon, RecordMoved}, Fenced, []Action{Fence}},
		{"a lapsed side does not claim from a silent peer", NewPrimary(), []Event{PeerSilent, ClaimWon, SecondaryJoined, TermLapsed, PeerSilent}, Lapsed, nil},
		{"a secondary has no term to lapse", NewSecondary(), []Event{TermLapsed}, Replicating, nil},
		{"a claiming side's claim decides, not a renewal", NewPrimary(), []Event{PeerSilent, RecordMoved}, Claiming, nil},
	} {
		s := c.side
		var last []Action
		for _, e := range c.events {
			acts, err := s.On(e)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			last = acts
		}
		if s.State != c.want || fmt.Sprint(last) != fmt.Sprint(c.acts) {
			t.Errorf("%s: %s %v, want %s %v", c.name, s.State, last, c.want, c.acts)
		}
	}
	s := NewSecondary()
	if _, err := s.On(ClaimWon); err == nil {
		t.Error("a claim won without a claim must be refused")
	}
	if _, err := s.On(SecondaryDropped); err == nil || s.State != Replicating {
		t.Errorf("a secondary has no secondary to drop: err %v, state %s", err, s.State)
	}
}
