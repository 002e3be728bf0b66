package colo

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/qmp"
)

// peripherals answers the QOM queries Netdev makes, for a machine with the given devices (id ->
// netdev, "" for a device that is not a NIC).
func peripherals(t *testing.T, devices map[string]string) *qmp.Conn {
	t.Helper()
	client, server := net.Pipe()
	go func() {
		w := json.NewEncoder(server)
		_ = w.Encode(map[string]any{"QMP": map[string]any{"version": map[string]any{}, "capabilities": []string{}}})
		r := bufio.NewScanner(server)
		for r.Scan() {
			var req struct {
				Execute   string            `json:"execute"`
				ID        string            `json:"id"`
				Arguments map[string]string `json:"arguments"`
			}
			if json.Unmarshal(r.Bytes(), &req) != nil {
				return
			}
			switch req.Execute {
			case "qmp_capabilities":
				_ = w.Encode(map[string]any{"id": req.ID, "return": map[string]any{}})
			case "qom-list":
				list := []map[string]string{{"name": "type", "type": "string"}}
				for id := range devices {
					list = append(list, map[string]string{"name": id, "type": "child<some-device>"})
				}
				_ = w.Encode(map[string]any{"id": req.ID, "return": list})
			case "qom-get":
				id := strings.TrimPrefix(req.Arguments["path"], "/machine/peripheral/")
				if nd := devices[id]; nd != "" && req.Arguments["property"] == "netdev" {
					_ = w.Encode(map[string]any{"id": req.ID, "return": nd})
				} else {
					_ = w.Encode(map[string]any{"id": req.ID, "error": map[string]any{"class": "GenericError", "desc": "Property '" + req.Arguments["property"] + "' not found"}})
				}
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

// TestNetdevIsTheOneNICsBackend: the packet filters go on the backend of the VM's one NIC,
// however its launcher named it; a VM with two NICs, or none, is refused.
func TestNetdevIsTheOneNICsBackend(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name    string
		devices map[string]string
		want    string // the netdev, or a part of the error
	}{
		{"libvirt", map[string]string{"ua-default": "hostua-default", "ua-rootdisk": ""}, "hostua-default"},
		{"the test launcher", map[string]string{"e0": "hn0"}, "hn0"},
		{"two NICs", map[string]string{"ua-a": "hostua-a", "ua-b": "hostua-b"}, "the VM has 2"},
		{"no NIC", map[string]string{"ua-rootdisk": ""}, "the VM has 0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Netdev(ctx, peripherals(t, tt.devices))
			if err != nil {
				got = err.Error()
			}
			if !strings.Contains(got, tt.want) {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}
