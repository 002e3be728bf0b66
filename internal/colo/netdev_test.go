package colo

import (
	"context"
	"strings"
	"testing"

	"github.com/lockstep-dev/lockstep/internal/qmp"
)

// peripherals is the monitor of a machine with the given devices (id -> netdev, "" for a device
// that is not a NIC), for the QOM queries Netdev makes.
func peripherals(t *testing.T, devices map[string]string) *qmp.Conn {
	t.Helper()
	return (&fakeQEMU{devices: devices}).conn(t)
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
