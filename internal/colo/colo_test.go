package colo

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/qmp"
)

// fakeQEMU is a QMP monitor of a VM with one NIC (netdev hn0) that answers every command with
// success, except those refuse names (command -> QEMU's error), and records the commands.
type fakeQEMU struct {
	refuse map[string]string

	mu   sync.Mutex
	cmds []string
}

func (f *fakeQEMU) conn(t *testing.T) *qmp.Conn {
	t.Helper()
	client, server := net.Pipe()
	go func() {
		w := json.NewEncoder(server)
		_ = w.Encode(map[string]any{"QMP": map[string]any{"version": map[string]any{}, "capabilities": []string{}}})
		r := bufio.NewScanner(server)
		for r.Scan() {
			var req struct {
				Execute string `json:"execute"`
				ID      string `json:"id"`
			}
			if json.Unmarshal(r.Bytes(), &req) != nil {
				return
			}
			f.mu.Lock()
			f.cmds = append(f.cmds, req.Execute)
			f.mu.Unlock()
			switch {
			case f.refuse[req.Execute] != "":
				_ = w.Encode(map[string]any{"id": req.ID, "error": map[string]any{"class": "GenericError", "desc": f.refuse[req.Execute]}})
			case req.Execute == "qom-list":
				_ = w.Encode(map[string]any{"id": req.ID, "return": []map[string]string{{"name": "e0", "type": "child<virtio-net-pci>"}}})
			case req.Execute == "qom-get":
				_ = w.Encode(map[string]any{"id": req.ID, "return": "hn0"})
			case req.Execute == "human-monitor-command":
				_ = w.Encode(map[string]any{"id": req.ID, "return": ""})
			default:
				_ = w.Encode(map[string]any{"id": req.ID, "return": map[string]any{}})
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := qmp.New(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	return q
}

func (f *fakeQEMU) commands() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.cmds...)
}

// TestStartPrimaryOnAQEMUWithoutRAMAhead: a QEMU without lockstep's x-colo-ram-ahead refuses the
// capability (QEMU 10.2's own words below). The primary is left as it was, and the error says
// what to do.
func TestStartPrimaryOnAQEMUWithoutRAMAhead(t *testing.T) {
	ctx := context.Background()
	s := Sockets{Dir: t.TempDir()}
	f := &fakeQEMU{refuse: map[string]string{"migrate-set-capabilities": "Parameter 'capability' does not accept value 'x-colo-ram-ahead'"}}
	err := StartPrimary(ctx, f.conn(t), s, Tuning{Checkpoint: 2 * time.Second, CompareTimeout: 100 * time.Millisecond, RAMAhead: true}, false)
	if err == nil || !strings.Contains(err.Error(), "--colo-ram-ahead=false") {
		t.Fatalf("StartPrimary: %v, want an error that names --colo-ram-ahead=false", err)
	}
	for _, c := range f.commands() {
		if c != "qmp_capabilities" && c != "qom-list" && c != "qom-get" && c != "migrate-set-capabilities" {
			t.Errorf("StartPrimary ran %s before the capability was refused: %v", c, f.commands())
		}
	}

	// Without RAMAhead no capability is refused: every step runs, the migration last.
	f = &fakeQEMU{}
	if err := StartPrimary(ctx, f.conn(t), s, Tuning{Checkpoint: 2 * time.Second, CompareTimeout: 100 * time.Millisecond}, false); err != nil {
		t.Fatal(err)
	}
	if cmds := f.commands(); cmds[len(cmds)-1] != "migrate" {
		t.Fatalf("the commands: %v, want the migration last", cmds)
	}
}
