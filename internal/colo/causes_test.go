package colo

import "testing"

func TestCauseCountsAddWhatEachCompareObjectCounted(t *testing.T) {
	var c causeCounts
	for _, step := range []struct {
		name              string
		newProtection     bool
		mismatch, timeout uint64 // what the compare object says
		want              [2]uint64
	}{
		{name: "the first read", mismatch: 3, timeout: 1, want: [2]uint64{3, 1}},
		{name: "no new checkpoint asked for", mismatch: 3, timeout: 1, want: [2]uint64{3, 1}},
		{name: "more of each", mismatch: 5, timeout: 4, want: [2]uint64{5, 4}},
		{name: "a new protection's object counts from zero", newProtection: true, mismatch: 2, timeout: 0, want: [2]uint64{7, 4}},
		{name: "and grows from there", mismatch: 2, timeout: 6, want: [2]uint64{7, 10}},
		{name: "an object replaced between two reads (counts went back)", mismatch: 1, timeout: 1, want: [2]uint64{7, 10}},
		{name: "and grows from its own counts", mismatch: 4, timeout: 1, want: [2]uint64{10, 10}},
	} {
		if step.newProtection {
			c.newProtection()
		}
		c.add(step.mismatch, step.timeout)
		if got := [2]uint64{c.mismatch, c.timeout}; got != step.want {
			t.Errorf("%s: %v checkpoints on a mismatch and on a timeout, want %v", step.name, got, step.want)
		}
	}
}
