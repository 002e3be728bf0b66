// Package term is the timing of the pair's record as a lease: how often the side that runs the
// VM renews it, when a side that could not renew must have paused, and when the operator, which
// never reads another node's clock, may take the VM from a holder it cannot see. It is pure: the
// agent (lockstepd) and the operator each feed it their own clock's readings.
//
// The rule, with T the term:
//
//   - A holder renews every T/5. Each renewal is a compare-and-set on the record's holder and
//     epoch; its start on the holder's clock is r.
//   - A holder whose last renewal that went through started at r pauses its VM and releases
//     nothing from r + T - T/6 on (its clock), unless a later renewal went through, and stops
//     its VM from r + T - T/12 on.
//   - The operator notes, on its clock, when it first saw each renewal (the record's holder,
//     epoch and renewTime). It may move the record away from a holder it cannot see only once
//     it has seen no new renewal for T·(1+ρ) + M: ρ bounds how much faster the holder's clock may
//     run than the operator's, M covers the pause itself.
//
// The operator first sees a renewal after the holder started it, so the holder has paused, and
// stopped its VM T/12 + M before, by the time the operator may act whatever the two clocks read;
// only their rates matter.
package term

import "time"

const (
	// RateMargin (ρ) bounds the difference between two nodes' clock rates: NTP keeps it below
	// 500 ppm; 2% leaves room for a VM's clock under load.
	RateMargin = 0.02
	// ObserverMargin (M) is what the operator waits beyond the term for the holder's pause to be
	// done: a QMP stop takes milliseconds.
	ObserverMargin = 2 * time.Second
	// Default is the term lockstepd writes when it is not told otherwise.
	Default = 30 * time.Second
	// Min is the shortest term that leaves room for a renewal's round trip and the holder's margin.
	Min = 5 * time.Second
)

// Term is the length of the record's lease.
type Term time.Duration

// Of is the term of a record whose Lease says seconds (spec.leaseDurationSeconds); a record that
// says none (written before terms, or by the operator before any member renewed) has the default.
func Of(seconds *int32) Term {
	if seconds == nil || *seconds <= 0 {
		return Term(Default)
	}
	return Term(time.Duration(*seconds) * time.Second)
}

// Seconds is the term as spec.leaseDurationSeconds says it.
func (t Term) Seconds() int32 { return int32(time.Duration(t) / time.Second) }

// RenewEvery is how often the holder renews.
func (t Term) RenewEvery() time.Duration { return time.Duration(t) / 5 }

// WitnessEvery is how often a secondary renews for its primary: its renewal, the channel's delay
// and the primary's own last renewal still leave the primary well inside its margin.
func (t Term) WitnessEvery() time.Duration { return time.Duration(t) / 3 }

// HolderMargin is how long before the term ends the holder has paused.
func (t Term) HolderMargin() time.Duration { return time.Duration(t) / 6 }

// PauseAt is when a holder whose last renewal that went through started at renewed must be paused.
func (t Term) PauseAt(renewed time.Time) time.Time {
	return renewed.Add(time.Duration(t) - t.HolderMargin())
}

// Lapsed says whether a holder whose last renewal started at renewed must be paused at now.
func (t Term) Lapsed(renewed, now time.Time) bool { return !now.Before(t.PauseAt(renewed)) }

// StopAt is when a paused holder whose last renewal started at renewed stops its VM: half its
// margin before the term ends, so that the stopped QEMU has T/12 and the operator's margin M
// (seconds, on a busy node) to let go of the VM's disks before the operator may start the VM
// elsewhere (Wait); a paused QEMU would keep them from that copy.
func (t Term) StopAt(renewed time.Time) time.Time {
	return renewed.Add(time.Duration(t) - t.HolderMargin()/2)
}

// Ended says whether a holder whose last renewal started at renewed must have stopped its VM at now.
func (t Term) Ended(renewed, now time.Time) bool { return !now.Before(t.StopAt(renewed)) }

// Wait is how long the operator waits after it first saw a renewal before the holder counts as
// paused.
func (t Term) Wait() time.Duration {
	return time.Duration(float64(t)*(1+RateMargin)) + ObserverMargin
}

// ExpiresIn is how long, at now, the operator must still wait for a renewal it first saw at seen
// (zero: the holder has paused, or never renewed at all).
func (t Term) ExpiresIn(seen, now time.Time) time.Duration {
	return max(0, seen.Add(t.Wait()).Sub(now))
}
