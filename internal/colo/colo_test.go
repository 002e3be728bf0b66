package colo

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"slices"
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

// TestAQEMUWithoutRAMAheadIsRefusedFirst: a QEMU without lockstep's x-colo-ram-ahead refuses the
// capability (QEMU 10.2's own words below). PrimaryCapabilities, which a protection runs first, says
// what to do; a QEMU that takes it gets it again in StartPrimary's COLO start.
func TestAQEMUWithoutRAMAheadIsRefusedFirst(t *testing.T) {
	ctx := context.Background()
	tuning := Tuning{Checkpoint: 2 * time.Second, CompareTimeout: 100 * time.Millisecond, RAMAhead: true}
	f := &fakeQEMU{refuse: map[string]string{"migrate-set-capabilities": "Parameter 'capability' does not accept value 'x-colo-ram-ahead'"}}
	err := PrimaryCapabilities(ctx, f.conn(t), tuning)
	if err == nil || !strings.Contains(err.Error(), "--colo-ram-ahead=false") {
		t.Fatalf("PrimaryCapabilities: %v, want an error that names --colo-ram-ahead=false", err)
	}
	if err := PrimaryCapabilities(ctx, f.conn(t), Tuning{}); err == nil || strings.Contains(err.Error(), "--colo-ram-ahead") {
		t.Fatalf("PrimaryCapabilities without RAMAhead, refused: %v, want QEMU's error alone", err)
	}

	f = &fakeQEMU{}
	if err := PrimaryCapabilities(ctx, f.conn(t), tuning); err != nil {
		t.Fatal(err)
	}
	if err := StartPrimary(ctx, f.conn(t), Sockets{Dir: t.TempDir()}, tuning, false); err != nil {
		t.Fatal(err)
	}
	cmds := f.commands()
	if n := slices.Index(cmds, "migrate-set-capabilities"); n < 0 || !slices.Contains(cmds[n+1:], "migrate-set-capabilities") || cmds[len(cmds)-1] != "migrate" {
		t.Fatalf("the commands: %v, want the capabilities set by both, and the migration last", cmds)
	}
}
