package gate

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

type output struct {
	id  int
	pos uint64
}

// TestNoOutputLeavesBeforeItsPositionIsAcknowledged drives the gate with random interleavings of
// outputs and acknowledgements (acks may repeat or arrive late, as on a real channel) and checks
// the output commit rule on every release: an output leaves only after its position is
// acknowledged, outputs leave in production order, none twice, and all of them once the log is
// acknowledged to the end.
func TestNoOutputLeavesBeforeItsPositionIsAcknowledged(t *testing.T) {
	for seed := range uint64(500) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 11))
			var g Gate[output]
			var logPos, acked uint64
			next, produced := 0, 0
			check := func(out []output) {
				for _, o := range out {
					if o.pos > acked {
						t.Fatalf("output %d after position %d left with only %d acknowledged", o.id, o.pos, acked)
					}
					if o.id != next {
						t.Fatalf("output %d left, %d was next", o.id, next)
					}
					next++
				}
			}
			for range 1000 {
				switch op := r.IntN(10); {
				case op < 3:
					logPos += uint64(r.IntN(3))
				case op < 7:
					out, err := g.Hold(logPos, output{produced, logPos})
					if err != nil {
						t.Fatal(err)
					}
					produced++
					check(out)
				default:
					ack := acked
					if logPos > acked {
						ack = acked + uint64(r.IntN(int(logPos-acked)+1))
					} else if acked > 0 && r.IntN(2) == 0 {
						ack = uint64(r.IntN(int(acked))) // a stale acknowledgement
					}
					if ack > acked {
						acked = ack
					}
					check(g.Ack(ack))
				}
			}
			acked = logPos
			check(g.Ack(logPos))
			if next != produced || g.Held() != 0 {
				t.Fatalf("released %d of %d outputs, %d still held", next, produced, g.Held())
			}
		})
	}
}

func TestGateRefusesPositionsGoingBackwards(t *testing.T) {
	var g Gate[int]
	if _, err := g.Hold(5, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Hold(4, 2); err == nil {
		t.Fatal("a position going backwards must be refused")
	}
}

func TestDropDiscardsWhatAFencedPrimaryHeld(t *testing.T) {
	var g Gate[int]
	for i := range 3 {
		if out, _ := g.Hold(uint64(i+1), i); len(out) != 0 {
			t.Fatalf("released %v before any ack", out)
		}
	}
	if dropped := g.Drop(); len(dropped) != 3 || dropped[0] != 0 || dropped[2] != 2 {
		t.Fatalf("dropped %v", dropped)
	}
	if out := g.Ack(10); len(out) != 0 {
		t.Fatalf("dropped outputs left after all: %v", out)
	}
}
