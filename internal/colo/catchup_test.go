package colo

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// TestCatchUpCopiesWhatTheBitmapMarksInRounds: the catch-up attaches the secondary's replica over
// NBD, copies what the bitmap marks (blockdev-backup sync=bitmap), runs its last round with the
// VM stopped once a round was small, detaches the replica, and returns the bytes copied with the
// VM stopped. A job that ended in an error fails it with QEMU's message, and the VM runs again.
func TestCatchUpCopiesWhatTheBitmapMarksInRounds(t *testing.T) {
	for _, c := range []struct {
		name    string
		job     map[string]any
		wantErr string
	}{
		{"two rounds", map[string]any{"id": "catchup0", "status": "concluded", "current-progress": 65536, "total-progress": 65536}, ""},
		{"a job that failed", map[string]any{"id": "catchup0", "status": "concluded", "current-progress": 0, "total-progress": 65536, "error": "Input/output error"}, "Input/output error"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeQEMU{replies: map[string]any{"query-jobs": []map[string]any{c.job}}}
			q := f.conn(t)
			var last uint64
			copied, err := catchUpDisks(context.Background(), q, Sockets{Dir: "/run/m"}, 1, func(done, _ uint64) { last = done })
			cmds := f.commands()
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) || cmds[len(cmds)-1] != "cont" || !slices.Contains(cmds, "blockdev-del") {
					t.Fatalf("got %v after %v; want the job's error, the replica detached and the VM running", err, cmds)
				}
				return
			}
			want := []string{"qmp_capabilities", "blockdev-add", "blockdev-backup", "query-jobs", "job-dismiss", "stop", "blockdev-backup", "query-jobs", "job-dismiss", "blockdev-del"}
			if err != nil || copied != 2*65536 || last != copied || !slices.Equal(cmds, want) {
				t.Fatalf("got %d bytes (progress %d), %v, commands %v; want %d, commands %v", copied, last, err, cmds, 2*65536, want)
			}
			for _, call := range f.calls() {
				if strings.HasPrefix(call, "blockdev-backup") && !strings.Contains(call, "sync=bitmap") || strings.HasPrefix(call, "blockdev-add") && !strings.Contains(call, "export=parent0") {
					t.Errorf("%s", call)
				}
			}
		})
	}
}
