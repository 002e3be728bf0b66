package term

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

func TestTheTermsNumbers(t *testing.T) {
	tm := Term(30 * time.Second)
	for _, c := range []struct {
		name      string
		got, want time.Duration
	}{
		{"renew every", tm.RenewEvery(), 6 * time.Second},
		{"holder margin", tm.HolderMargin(), 5 * time.Second},
		{"a witness renews every", tm.WitnessEvery(), 10 * time.Second},
		{"operator's wait", tm.Wait(), 30*time.Second + 600*time.Millisecond + 2*time.Second},
	} {
		if c.got != c.want {
			t.Errorf("%s: %s, want %s", c.name, c.got, c.want)
		}
	}
	r := time.Unix(1000, 0)
	if tm.Lapsed(r, r.Add(25*time.Second-time.Nanosecond)) || !tm.Lapsed(r, r.Add(25*time.Second)) {
		t.Error("a holder pauses 25 s after its last renewal started, not before")
	}
	if tm.Ended(r, r.Add(27500*time.Millisecond-time.Nanosecond)) || !tm.Ended(r, r.Add(27500*time.Millisecond)) {
		t.Error("a paused holder stops its VM 27.5 s after its last renewal started, not before")
	}
	if got := tm.ExpiresIn(r, r.Add(10*time.Second)); got != 22600*time.Millisecond {
		t.Errorf("ExpiresIn 10 s after the renewal was seen: %s", got)
	}
	if got := tm.ExpiresIn(r, r.Add(time.Hour)); got != 0 {
		t.Errorf("ExpiresIn long after: %s", got)
	}
	if Of(nil) != Term(Default) || Of(new(int32(0))) != Term(Default) || Of(new(int32(12))) != Term(12*time.Second) {
		t.Error("Of: a record without a term has the default one")
	}
	if Term(12*time.Second).Seconds() != 12 {
		t.Error("Seconds")
	}
}

// TestTheOperatorActsOnlyAfterTheHolderPaused runs a holder and the operator on clocks with
// arbitrary offsets and rates at most 2% apart (RateMargin), renewals that take up to a second
// to reach the API server and watches that reach the operator up to 5 s late, and the holder
// cut from the API server at a random moment. Whenever the operator may act, the holder's own
// clock says it has paused, and stopped its VM T/12 before at least.
func TestTheOperatorActsOnlyAfterTheHolderPaused(t *testing.T) {
	for seed := range uint64(5000) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 58))
			tm := Term(time.Duration(5+r.IntN(60)) * time.Second)
			// Delays are often none at all: the operator may see a renewal the moment it starts.
			delay := func(most time.Duration) time.Duration {
				if r.IntN(2) == 0 {
					return 0
				}
				return time.Duration(r.Int64N(int64(most)))
			}
			// Each clock reads offset + rate·real; the rates differ by at most RateMargin.
			type clock struct {
				offset time.Duration
				rate   float64
			}
			read := func(c clock, real time.Duration) time.Time {
				return time.Unix(0, 0).Add(c.offset + time.Duration(float64(real)*c.rate))
			}
			holder := clock{time.Duration(r.Int64N(int64(time.Hour))) - 30*time.Minute, 1 + (r.Float64()-0.5)*0.02}
			op := clock{time.Duration(r.Int64N(int64(time.Hour))) - 30*time.Minute, 1 + (r.Float64()-0.5)*0.02}
			// The claim that made the holder one is its first renewal: it went through.
			first := delay(time.Second)
			cut := first + time.Duration(r.Int64N(int64(5*time.Minute)))

			// The holder renews every RenewEvery of its clock until the cut; each renewal lands
			// at the API server after a delay, and the operator sees it after another.
			var lastStart time.Duration // real time of the last renewal that went through
			var opSeen time.Time        // the operator's clock when it saw the newest renewal
			step := time.Duration(float64(tm.RenewEvery()) / holder.rate)
			for real := time.Duration(0); real < cut; real += step {
				landed := real + delay(time.Second)
				if real == 0 {
					landed = first
				}
				if landed >= cut && real > 0 {
					break // cut on the way: it never went through
				}
				lastStart = real
				opSeen = read(op, landed+delay(5*time.Second))
			}
			// The holder pauses when its own clock says so.
			var pausedAt time.Duration
			for pausedAt = lastStart; !tm.Lapsed(read(holder, lastStart), read(holder, pausedAt)); pausedAt += 10 * time.Millisecond {
			}
			// The operator acts when its clock says the wait is over.
			var actsAt time.Duration
			for actsAt = cut; tm.ExpiresIn(opSeen, read(op, actsAt)) > 0; actsAt += 10 * time.Millisecond {
			}
			if actsAt < pausedAt {
				t.Fatalf("term %s: the operator acts at %s, the holder pauses at %s (renewed at %s, cut at %s)", time.Duration(tm), actsAt, pausedAt, lastStart, cut)
			}
			// And stops its VM, releasing its disks, before the operator starts another.
			var stoppedAt time.Duration
			for stoppedAt = pausedAt; !tm.Ended(read(holder, lastStart), read(holder, stoppedAt)); stoppedAt += 10 * time.Millisecond {
			}
			// with time for its QEMU to exit and let go of the disks: T/12 at least.
			if actsAt-stoppedAt < tm.HolderMargin()/2 {
				t.Fatalf("term %s: the operator acts at %s, the holder stops its VM at %s, less than T/12 before (renewed at %s, cut at %s)", time.Duration(tm), actsAt, stoppedAt, lastStart, cut)
			}
		})
	}
}
