package ftlog

import (
	"testing"
	"time"
)

func TestIntervalIsAMovingAverage(t *testing.T) {
	var i Interval
	i.Observe(10 * time.Millisecond)
	if i.Value() != 10*time.Millisecond {
		t.Fatalf("first sample: %v", i.Value())
	}
	for range 100 {
		i.Observe(time.Millisecond)
	}
	if v := i.Value(); v < time.Millisecond || v > 1100*time.Microsecond {
		t.Fatalf("after 100 samples of 1ms: %v", v)
	}
	i.Observe(-time.Second)
	if v := i.Value(); v < time.Millisecond {
		t.Fatalf("a negative sample moved it: %v", v)
	}
}

func TestPacerSlowsOnlyASustainedLagAndRecovers(t *testing.T) {
	p := Pacer{Threshold: 50 * time.Millisecond, Sustain: time.Second, Min: 100 * time.Microsecond, Max: 10 * time.Millisecond}
	t0 := time.Unix(0, 0)
	if d := p.Update(80*time.Millisecond, t0); d != 0 {
		t.Fatalf("a lag not yet sustained slowed the primary: %v", d)
	}
	if d := p.Update(20*time.Millisecond, t0.Add(500*time.Millisecond)); d != 0 {
		t.Fatalf("below the threshold: %v", d)
	}
	// Above again: the clock restarts.
	p.Update(80*time.Millisecond, t0.Add(600*time.Millisecond))
	if d := p.Update(80*time.Millisecond, t0.Add(1500*time.Millisecond)); d != 0 {
		t.Fatalf("sustained only 0.9s: %v", d)
	}
	now := t0.Add(1700 * time.Millisecond)
	if d := p.Update(80*time.Millisecond, now); d != p.Min {
		t.Fatalf("sustained: want %v, got %v", p.Min, d)
	}
	for range 20 {
		now = now.Add(100 * time.Millisecond)
		p.Update(80*time.Millisecond, now)
	}
	if p.Delay() != p.Max {
		t.Fatalf("capped at %v, got %v", p.Max, p.Delay())
	}
	for range 20 {
		now = now.Add(100 * time.Millisecond)
		p.Update(10*time.Millisecond, now)
	}
	if p.Delay() != 0 {
		t.Fatalf("recovered lag still slows: %v", p.Delay())
	}
}
