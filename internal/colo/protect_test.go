package colo

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"

	"github.com/lockstep-dev/lockstep/internal/engine"
)

// logged is an engine.Recorder that keeps what is appended.
type logged struct {
	mu      sync.Mutex
	entries []string
}

func (l *logged) Append(_ context.Context, data []byte) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, string(data))
	return uint64(len(l.entries)), nil
}

func (l *logged) Output(release func()) { release() }

// TestASecondaryIsMigratedIntoOnce: a Resync for the member the current protection protects
// (the agent started a new log to it, or asked again while the protection was being made) keeps
// that protection and logs "ready" again, while it holds; it never tears it down to migrate into
// the same secondary again, which QEMU cannot do: that held the VM's output for the 5 minutes
// the migration waited (a 40-step soak found it). Once that protection no longer holds, the
// member is refused at once, before anything holds the VM's output.
func TestASecondaryIsMigratedIntoOnce(t *testing.T) {
	up := []map[string]string{{"label": "mirror0", "filename": "unix:/m"}, {"label": "compare1", "filename": "unix:/c"}}
	down := []map[string]string{{"label": "mirror0", "filename": "disconnected:unix:/m"}, {"label": "compare1", "filename": "unix:/c"}}
	for _, c := range []struct {
		name      string
		protected bool
		chardevs  []map[string]string
		wantErr   bool
	}{
		{"the protection holds: ready again", true, up, false},
		{"its streams are down: refused", true, down, true},
		{"the protection ended: refused", false, up, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeQEMU{replies: map[string]any{"query-colo-status": map[string]any{"mode": "primary", "last-mode": "none", "reason": "none"}, "query-chardev": c.chardevs}}
			e := NewEngine(EngineConfig{Pair: "ns/vm", Member: "vm-1", Primary: true, Sockets: Sockets{Dir: t.TempDir()}, Log: logr.Discard()})
			q := f.conn(t)
			e.q, e.replicated = q, 1
			e.peer, e.protectedPeer, e.protected = engine.Peer{Member: "vm-2"}, "vm-2", c.protected
			rec := &logged{}
			err := e.protect(context.Background(), q, rec)
			for _, held := range []string{"x-colo-lost-heartbeat", "drive-mirror", "migrate", "object-add", "object-del"} {
				if slices.Contains(f.calls(), held) {
					t.Errorf("the engine ran %s against a secondary it protected before: %v", held, f.calls())
				}
			}
			if c.wantErr {
				if !errors.Is(err, errProtectedOnce) || !strings.Contains(err.Error(), "vm-2") || len(rec.entries) != 0 {
					t.Errorf("got %v, logged %v; want the member refused", err, rec.entries)
				}
				return
			}
			if err != nil || len(rec.entries) != 1 || !strings.Contains(rec.entries[0], `"ready"`) {
				t.Errorf("got %v, logged %v; want ready logged again", err, rec.entries)
			}
		})
	}
}
