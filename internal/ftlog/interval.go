package ftlog

import "time"

// Interval is the vLockstep interval (white paper 1.3): a moving average of how far the secondary
// trails the primary, measured from when an entry was logged to when its acknowledgement arrived.
// It includes the round trip, which the paper assumes constant.
type Interval struct {
	// Alpha is the weight of a new sample (0 < Alpha <= 1); 0 means 0.1.
	Alpha float64
	avg   float64
	seen  bool
}

// Observe adds a sample; negative samples (clock steps) are ignored.
func (i *Interval) Observe(d time.Duration) {
	if d < 0 {
		return
	}
	a := i.Alpha
	if a <= 0 || a > 1 {
		a = 0.1
	}
	if !i.seen {
		i.avg, i.seen = float64(d), true
		return
	}
	i.avg += a * (float64(d) - i.avg)
}

// Value is the current average (0 before the first sample).
func (i *Interval) Value() time.Duration { return time.Duration(i.avg) }

// Pacer slows the primary when the interval is consistently high (paper 1.3: "the hypervisor may
// slow the primary virtual machine to let the secondary catch up"). It returns a delay to insert
// before each new log entry: it starts at Min once the interval has stayed above Threshold for
// Sustain, doubles on every further update above it up to Max, and halves back to zero below it.
type Pacer struct {
	Threshold, Sustain time.Duration
	Min, Max           time.Duration

	above time.Time // since when the interval has been above the threshold
	delay time.Duration
}

// Update takes the current interval and returns the delay to apply per entry.
func (p *Pacer) Update(interval time.Duration, now time.Time) time.Duration {
	if interval <= p.Threshold {
		p.above = time.Time{}
		p.delay /= 2
		if p.delay < p.Min/2 {
			p.delay = 0
		}
		return p.delay
	}
	if p.above.IsZero() {
		p.above = now
	}
	if now.Sub(p.above) < p.Sustain {
		return p.delay
	}
	switch {
	case p.delay == 0:
		p.delay = p.Min
	case p.delay < p.Max:
		p.delay = min(2*p.delay, p.Max)
	}
	return p.delay
}

// Delay is the current per-entry delay.
func (p *Pacer) Delay() time.Duration { return p.delay }
