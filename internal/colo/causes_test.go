package colo

import "testing"

func TestCauseCountsAddWhatEachCompareObjectCounted(t *testing.T) {
	var c causeCounts
	for _, step := range []struct {
		name          string
		newProtection bool
		now           Causes // what the compare object says
		want          Causes
	}{
		{name: "the first read", now: Causes{3, 1, 2, 1, 9}, want: Causes{3, 1, 2, 1, 9}},
		{name: "no new checkpoint asked for", now: Causes{3, 1, 2, 1, 9}, want: Causes{3, 1, 2, 1, 9}},
		{name: "more of each", now: Causes{5, 4, 3, 2, 12}, want: Causes{5, 4, 3, 2, 12}},
		{name: "a new protection's object counts from zero", newProtection: true, now: Causes{2, 0, 1, 0, 1}, want: Causes{7, 4, 4, 2, 13}},
		{name: "and grows from there", now: Causes{2, 6, 1, 3, 5}, want: Causes{7, 10, 4, 5, 17}},
		{name: "an object replaced between two reads (counts went back)", now: Causes{1, 1, 0, 0, 0}, want: Causes{7, 10, 4, 5, 17}},
		{name: "and grows from its own counts", now: Causes{4, 1, 2, 1, 3}, want: Causes{10, 10, 6, 6, 20}},
	} {
		if step.newProtection {
			c.newProtection()
		}
		c.add(step.now)
		if c.life != step.want {
			t.Errorf("%s: %+v over the side's life, want %+v", step.name, c.life, step.want)
		}
	}
}
