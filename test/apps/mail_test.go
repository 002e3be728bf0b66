package apps

import (
	"strings"
	"testing"
)

// TestMailCheck: every accepted message must be in the mailbox once; a message in doubt may be
// there or not; none twice, but one sent before the VM restarted from its disks, and that one
// not three times.
func TestMailCheck(t *testing.T) {
	m := &Mail{accepted: map[int]bool{1: true, 2: true, 4: true}, inDoubt: map[int]bool{3: true}}
	lines := func(seqs ...string) string {
		var b strings.Builder
		for _, s := range seqs {
			b.WriteString(SeqHeader + ": " + s + "\n")
		}
		return b.String()
	}
	for _, c := range []struct {
		name, mailbox, wantErr string
		restartedBefore        int // Restarted called before this message was sent; 0: never
	}{
		{"all there", lines("1", "2", "4"), "", 0},
		{"the one in doubt there too", lines("1", "2", "3", "4"), "", 0},
		{"one lost", lines("1", "4"), "1 accepted messages are not in the mailbox: [2]", 0},
		{"one twice", lines("1", "2", "2", "4"), "1 messages are in the mailbox more than once: [2]", 0},
		{"one twice, sent before a restart", lines("1", "2", "2", "4"), "", 3},
		{"one three times, sent before a restart", lines("1", "2", "2", "2", "4"), "1 messages are in the mailbox more than once: [2]", 3},
		{"one twice, sent after a restart", lines("1", "2", "4", "4"), "1 messages are in the mailbox more than once: [4]", 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			m.restartedBefore = c.restartedBefore
			r, err := m.Check(c.mailbox)
			if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Fatalf("got %v, want %q", err, c.wantErr)
			}
			if want := c.restartedBefore > 0 && c.wantErr == ""; (r.Redelivered == 1) != want {
				t.Errorf("redelivered %d, want one: %v", r.Redelivered, want)
			}
			if r.Accepted != 3 || r.InDoubt != 1 {
				t.Errorf("report %+v", r)
			}
		})
	}
}
