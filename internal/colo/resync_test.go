package colo

import (
	"strings"
	"testing"
)

// TestResyncState: the resync has caught up only when every disk's job is ready; its progress
// sums the jobs; a job that is gone before it caught up is an error that names its disk.
func TestResyncState(t *testing.T) {
	for _, c := range []struct {
		name        string
		jobs        []Job
		caughtUp    bool
		done, total uint64
		wantErr     string
	}{
		{"copying", []Job{{ID: "resync0", Done: 100, Len: 400}, {ID: "resync1", Done: 50, Len: 100}}, false, 150, 500, ""},
		{"one ready", []Job{{ID: "resync0", Ready: true, Done: 400, Len: 400}, {ID: "resync1", Done: 50, Len: 100}}, false, 450, 500, ""},
		{"all ready", []Job{{ID: "resync0", Ready: true, Done: 400, Len: 400}, {ID: "resync1", Ready: true, Done: 100, Len: 100}}, true, 500, 500, ""},
		{"another job beside", []Job{{ID: "resync0", Ready: true, Done: 4, Len: 4}, {ID: "resync1", Ready: true, Done: 1, Len: 1}, {ID: "backup", Len: 99}}, true, 5, 5, ""},
		{"a copy ended early", []Job{{ID: "resync0", Done: 100, Len: 400}}, false, 0, 0, "disk 1 ended before it caught up"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var done, total uint64
			caughtUp, err := resyncState(c.jobs, 2, func(d, tt uint64) { done, total = d, tt })
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("got %v, want an error saying %q", err, c.wantErr)
				}
				return
			}
			if err != nil || caughtUp != c.caughtUp || done != c.done || total != c.total {
				t.Fatalf("got caught up %v, %d of %d, %v; want %v, %d of %d", caughtUp, done, total, err, c.caughtUp, c.done, c.total)
			}
		})
	}
}
