package colo

import (
	"encoding/binary"
	"testing"
	"time"
)

func words(ms ...uint32) []byte {
	b := make([]byte, 4*len(ms))
	for i, m := range ms {
		binary.BigEndian.PutUint32(b[4*i:], m)
	}
	return b
}

func TestCheckpointsTimesPausesAndIntervals(t *testing.T) {
	clock := time.Unix(1000, 0)
	var got []Checkpoint
	ready := 0
	c := &Checkpoints{Now: func() time.Time { return clock }, OnReady: func() { ready++ }, OnCheckpoint: func(cp Checkpoint) { got = append(got, cp) }}
	feed := func(after time.Duration, m uint32) {
		clock = clock.Add(after)
		// Byte by byte: the stream arrives in pieces of any size.
		for _, b := range words(m) {
			c.Observe([]byte{b})
		}
	}
	feed(0, msgCheckpointReady)
	if !c.Ready() || ready != 1 {
		t.Fatalf("ready %v (%d calls) after checkpoint-ready", c.Ready(), ready)
	}
	feed(100*time.Millisecond, msgCheckpointReply)
	feed(30*time.Millisecond, msgVMStateReceived)
	feed(10*time.Millisecond, msgVMStateLoaded) // pause 30ms, load 10ms
	feed(2*time.Second, msgCheckpointReply)
	feed(50*time.Millisecond, msgVMStateReceived)
	feed(20*time.Millisecond, msgVMStateLoaded) // pause 50ms, load 20ms, interval 2.07s
	if len(got) != 2 {
		t.Fatalf("%d checkpoints, want 2", len(got))
	}
	if got[0].N != 1 || got[0].Pause != 30*time.Millisecond || got[0].Load != 10*time.Millisecond || got[0].Interval != 0 {
		t.Errorf("first checkpoint %+v", got[0])
	}
	if got[1].N != 2 || got[1].Pause != 50*time.Millisecond || got[1].Load != 20*time.Millisecond || got[1].Interval != 2070*time.Millisecond {
		t.Errorf("second checkpoint %+v", got[1])
	}
	if !got[1].Committed.Before(got[1].At) || got[1].At.Sub(got[1].Committed) != 20*time.Millisecond {
		t.Errorf("commit point %v, end %v", got[1].Committed, got[1].At)
	}
	if c.Err() != nil {
		t.Fatal(c.Err())
	}
}

func TestCheckpointsReportsAStrangeStream(t *testing.T) {
	c := &Checkpoints{}
	c.Observe(words(msgCheckpointReady, 42, msgCheckpointReply))
	if c.Err() == nil || !c.Ready() {
		t.Fatalf("err %v, ready %v: want the unexpected word reported and the rest read", c.Err(), c.Ready())
	}
	c.Observe(words(msgCheckpointReady)[:3]) // half a word: nothing yet
	if c.Err().Error() != "unexpected COLO message on the return path: 42" {
		t.Fatal(c.Err())
	}
}

func TestForcedCheckpoints(t *testing.T) {
	period := 2 * time.Second
	for _, tc := range []struct {
		name     string
		interval time.Duration
		want     bool
	}{
		{"the first checkpoint", 0, false},
		{"due on the period", 2*time.Second + 20*time.Millisecond, false},
		{"a little early: the pause differs", 1850 * time.Millisecond, false},
		{"asked for by colo-compare", 300 * time.Millisecond, true},
		{"just under nine tenths", 1799 * time.Millisecond, true},
	} {
		if got := Forced(Checkpoint{Interval: tc.interval}, period); got != tc.want {
			t.Errorf("%s: Forced = %v, want %v", tc.name, got, tc.want)
		}
	}
	if Forced(Checkpoint{Interval: time.Millisecond}, 0) {
		t.Error("without a period no checkpoint counts as forced")
	}
}
