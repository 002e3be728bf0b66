package lockstepd

import (
	"slices"
	"testing"
	"time"
)

// TestStaleMemberDirs: a member's directory goes once no member has its UID, on a sweep at least
// the grace after the one that first found it so; one whose VMI is back, or that is not named by
// a UID, stays.
func TestStaleMemberDirs(t *testing.T) {
	const (
		a     = "0c4e2f1a-7b3d-4e5f-9a1b-2c3d4e5f6a7b"
		b     = "6d1a7f0e-2c84-5b43-9a6e-3f2b1c0d9e8a"
		c     = "9f0e1d2c-3b4a-4958-8776-655443322110"
		grace = 10 * time.Minute
	)
	t0 := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	dirs := []string{a, b, c, "lost+found", "not-a-uid"}
	var absent map[string]time.Time
	for _, step := range []struct {
		name string
		live []string
		at   time.Duration
		gone []string
	}{
		{"the first sweep finds b and c without their VMIs: nothing goes yet", []string{a}, 0, nil},
		{"before the grace: nothing goes", []string{a}, 5 * time.Minute, nil},
		{"c's VMI is back (the cache was behind)", []string{a, c}, 8 * time.Minute, nil},
		{"after the grace: b goes; c was found absent anew", []string{a}, 11 * time.Minute, []string{b}},
		{"c after its own grace; a's VMI is gone only now", nil, 22 * time.Minute, []string{c}},
		{"a after its grace", nil, 32 * time.Minute, []string{a}},
	} {
		live := map[string]bool{}
		for _, l := range step.live {
			live[l] = true
		}
		var gone []string
		absent, gone = staleMemberDirs(dirs, live, absent, t0.Add(step.at), grace)
		slices.Sort(gone)
		if !slices.Equal(gone, step.gone) {
			t.Errorf("%s: %v go, want %v", step.name, gone, step.gone)
		}
		dirs = slices.DeleteFunc(dirs, func(d string) bool { return slices.Contains(gone, d) })
	}
}
