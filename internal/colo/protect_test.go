package colo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/lockstep-dev/lockstep/internal/engine"
)

// logged is an engine.Recorder that keeps what is appended. DropSecondary answers dropErr and
// notes how many QMP commands fake had seen by then.
type logged struct {
	mu      sync.Mutex
	entries []string
	fake    *fakeQEMU
	dropErr error
	drops   []int // len(fake.commands()) at each DropSecondary
}

func (l *logged) DropSecondary(context.Context, string) error {
	n := 0
	if l.fake != nil {
		n = len(l.fake.commands())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.drops = append(l.drops, n)
	return l.dropErr
}

func (l *logged) dropped() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.drops)
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
				if slices.Contains(f.commands(), held) {
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

// TestABrokenProtectionIsClaimedBeforeItsOutputLeaves: once its secondary took the VM's state, a
// protection ends (its teardown releases what colo-compare holds) only after lockstepd claimed
// the pair from that secondary, which may still answer its log and must never go live with the
// older state. Whether a Resync finds it broken or the engine's own check does. When the claim is
// lost, nothing is torn down: the side is fenced with the output still held.
func TestABrokenProtectionIsClaimedBeforeItsOutputLeaves(t *testing.T) {
	up := []map[string]string{{"label": "mirror0", "filename": "unix:/m"}, {"label": "compare1", "filename": "unix:/c"}}
	down := []map[string]string{{"label": "mirror0", "filename": "disconnected:unix:/m"}, {"label": "compare1", "filename": "unix:/c"}}
	releases := func(cmd string) bool { return cmd == "x-colo-lost-heartbeat" || cmd == "object-del" }
	for _, c := range []struct {
		name     string
		chardevs []map[string]string
		resync   bool          // a Resync asks for the secondary again; otherwise only the engine's check runs
		dropErr  error         // the claim's answer
		drops    int           // claims wanted
		teardown bool          // whether the protection may be torn down
		exit     string        // the reason of a COLO_EXIT QEMU sends
		since    time.Duration // since the last checkpoint
	}{
		{name: "a Resync finds it broken: claimed, then torn down", chardevs: down, resync: true, drops: 1, teardown: true},
		{name: "the engine's check finds it broken: claimed, then torn down", chardevs: down, drops: 1, teardown: true},
		{name: "the claim is lost: nothing released", chardevs: down, dropErr: engine.ErrFenced, drops: 1},
		{name: "it holds: nothing", chardevs: up},
		{name: "QEMU left COLO on an error: claimed, then torn down", chardevs: up, exit: "error", drops: 1, teardown: true},
		{name: "QEMU left COLO on request: nothing", chardevs: up, exit: "request"},
		{name: "no checkpoint for a minute: claimed, then torn down", chardevs: up, since: time.Minute, drops: 1, teardown: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeQEMU{replies: map[string]any{"query-colo-status": map[string]any{"mode": "primary", "last-mode": "none", "reason": "none"}, "query-chardev": c.chardevs}}
			e := NewEngine(EngineConfig{Pair: "ns/vm", Member: "vm-1", Primary: true, Sockets: Sockets{Dir: t.TempDir()}, Log: logr.Discard()})
			if c.exit != "" {
				f.events = map[string][]map[string]any{"cont": {{"event": "COLO_EXIT", "data": map[string]any{"mode": "primary", "reason": c.exit}}}}
			}
			q := f.conn(t)
			e.q, e.replicated, e.watchEvery = q, 1, 10*time.Millisecond
			e.peer, e.protectedPeer, e.protected = engine.Peer{Member: "vm-2"}, "vm-2", true
			e.lastCheckpoint = time.Now().Add(-c.since)
			rec := &logged{fake: f, dropErr: c.dropErr}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- e.Run(ctx, rec) }()
			if c.resync {
				e.Resync()
			}
			deadline := time.Now().Add(5 * time.Second)
			for len(rec.dropped()) < c.drops && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(300 * time.Millisecond) // what the engine does next
			cancel()
			if err := <-done; !errors.Is(err, c.dropErr) || (err == nil) != (c.dropErr == nil) {
				t.Fatalf("Run returned %v, want %v", err, c.dropErr)
			}
			drops := rec.dropped()
			if len(drops) != c.drops {
				t.Fatalf("the pair was claimed %d times, want %d; QEMU saw %v", len(drops), c.drops, f.commands())
			}
			cmds := f.commands()
			first := slices.IndexFunc(cmds, releases)
			if !c.teardown {
				if first >= 0 {
					t.Fatalf("the protection was torn down (%s), releasing the held output: %v", cmds[first], cmds)
				}
				return
			}
			if first < 0 {
				t.Fatalf("the broken protection was never torn down: %v", cmds)
			}
			if first < drops[0] {
				t.Fatalf("%s ran before the pair was claimed from the secondary: %v (claimed after %d commands)", cmds[first], cmds, drops[0])
			}
		})
	}
}

// TestAPrimaryWhoseQEMUIsStuckStopsItsEngine: a protected primary's QEMU that does not answer its
// monitor, twice in a row, has its main loop stuck with the big lock held, and its VM with it.
// The engine stops with an error (the agent then fences the side, which kills QEMU, and the
// secondary takes over from the last checkpoint) without a command sent to that QEMU: a claim's
// teardown would hang on it as well.
func TestAPrimaryWhoseQEMUIsStuckStopsItsEngine(t *testing.T) {
	up := []map[string]string{{"label": "mirror0", "filename": "unix:/m"}, {"label": "compare1", "filename": "unix:/c"}}
	f := &fakeQEMU{hang: map[string]bool{"query-colo-status": true}, replies: map[string]any{"query-chardev": up}}
	e := NewEngine(EngineConfig{Pair: "ns/vm", Member: "vm-1", Primary: true, Sockets: Sockets{Dir: t.TempDir()}, Log: logr.Discard()})
	q := f.conn(t)
	e.q, e.replicated, e.watchEvery, e.monitorTimeout = q, 1, 10*time.Millisecond, 50*time.Millisecond
	e.peer, e.protectedPeer, e.protected = engine.Peer{Member: "vm-2"}, "vm-2", true
	e.lastCheckpoint = time.Now()
	rec := &logged{fake: f}
	done := make(chan error, 1)
	go func() { done <- e.Run(context.Background(), rec) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "stuck") {
			t.Fatalf("Run returned %v, want the VM stuck", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the engine went on with a QEMU that does not answer")
	}
	if n := len(rec.dropped()); n != 0 {
		t.Fatalf("the pair was claimed %d times from a stuck QEMU's engine", n)
	}
	for _, c := range f.commands() {
		if c != "qmp_capabilities" && c != "cont" && c != "query-colo-status" {
			t.Fatalf("the engine sent %s to a QEMU that does not answer: %v", c, f.commands())
		}
	}
}

// TestProtectFailureKeepsTheFirstReason: after a secondary's first protection failed, every retry
// fails because it cannot be migrated into twice; the status keeps the first reason beside it.
func TestProtectFailureKeepsTheFirstReason(t *testing.T) {
	first := errors.New("primary COLO start: object-add: Invalid parameter 'x-crossed-timeout'")
	once := fmt.Errorf("%w: secondary vm-2 (its protection ended)", errProtectedOnce)
	msg := ""
	for i, tc := range []struct {
		err  error
		want string
	}{
		{first, first.Error()},
		{once, once.Error() + "; its protection failed first: " + first.Error()},
		{once, once.Error() + "; its protection failed first: " + first.Error()}, // every retry: no longer
		{first, first.Error()}, // a new secondary's own failure
	} {
		if msg = protectFailure(msg, tc.err); msg != tc.want {
			t.Errorf("failure %d: %q, want %q", i+1, msg, tc.want)
		}
	}
	if got := protectFailure("", once); got != once.Error() {
		t.Errorf("with nothing before: %q", got)
	}
}
