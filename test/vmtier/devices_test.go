//go:build linux && vmtier

package vmtier

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/failover"
)

// TestLibvirtSecondaryFollowsTheGuestsDevices: under COLO a guest unbinds its NIC's PCI function
// from the virtio-pci driver (which turns its bus mastering off and disables the virtio device), as
// Linux does when it probes a device at boot or reloads a driver, on one side only. A checkpoint
// that loads the primary's device state into the secondary's leaves the "disabled" flag out when
// it is clear (QEMU sends it only when it is set): a secondary device that had it set kept it, and
// went live with its NIC dead (hack/qemu/virtio-load-flag-defaults.patch); a VM protected while
// its kernel probed its devices hit it by chance. The test makes each side's divergence on
// purpose, through the guest agent of that side alone (each side's own libvirt), which the other
// side's guest never hears of:
//   - three times the secondary's guest alone unbinds: the secondary's NIC must be disabled while
//     the primary's is not, and enabled again after the next checkpoint;
//   - then the primary's guest alone unbinds, a checkpoint carries the flag to the secondary, and
//     the primary's guest alone binds again: the checkpoint after that must clear it.
//
// Then the primary's QEMU is killed, and the secondary must serve.
func TestLibvirtSecondaryFollowsTheGuestsDevices(t *testing.T) {
	c, cl, p, s := protectedPairOf(t, 2, viaLibvirt, debian)
	const (
		pci    = "$(basename $(readlink -f /sys/class/net/eth0/device/..))"
		unbind = "echo " + pci + " >/sys/bus/pci/drivers/virtio-pci/unbind"
	)
	for episode := 1; episode <= 3; episode++ {
		// A checkpoint may come between the agent's request and the unbinding and take it back
		// (the primary's guest never asked): ask again until the secondary's NIC is disabled.
		from := -1
		for try := 0; from < 0; try++ {
			if try == 10 {
				c.dump()
				t.Fatalf("episode %d: the secondary's NIC was never disabled after %d requests to its guest agent", episode, try)
			}
			if err := guestExec(s, unbind); err != nil {
				t.Logf("episode %d: the secondary's guest agent: %v", episode, err)
			}
			if waitNIC(t, s, true, 5*time.Second) {
				from = c.checkpointCount()
			}
		}
		if nicDisabled(t, p) {
			t.Fatalf("episode %d: the primary's NIC is disabled too: its guest heard of the secondary's request", episode)
		}
		c.nicEnabledAfterCheckpoint(s, from, fmt.Sprintf("episode %d: after its guest alone unbound it", episode))
		cl.next("the primary serves after the secondary's guest unbound its NIC", time.Minute)
	}

	// The primary's guest alone: it keeps the PCI function and the address to bind and put back
	// (eth0 is gone while the function is unbound).
	if err := guestExec(p, "echo "+pci+" >/run/eth0-pci; ip -4 -o addr show eth0 | awk '{print $4}' >/run/eth0-addr; "+unbind); err != nil {
		t.Fatalf("the primary's guest agent: %v", err)
	}
	if !waitNIC(t, s, true, 30*time.Second) {
		c.dump()
		t.Fatal("no checkpoint carried the primary's disabled NIC to the secondary in 30 s")
	}
	if err := guestExec(p, "cat /run/eth0-pci >/sys/bus/pci/drivers/virtio-pci/bind; sleep 1; ip addr add $(cat /run/eth0-addr) dev eth0; ip link set eth0 up"); err != nil {
		t.Fatalf("the primary's guest agent: %v", err)
	}
	if !waitNIC(t, p, false, 10*time.Second) {
		t.Fatal("the primary's NIC is still disabled 10 s after its guest bound it again")
	}
	c.nicEnabledAfterCheckpoint(s, c.checkpointCount(), "after the primary's guest alone bound it again")
	for range 3 {
		cl.next("the primary serves with its NIC bound again", time.Minute)
	}
	killed := time.Now()
	p.killQEMU()
	failedOver(t, c, cl, p, s, killed, "kill -9 of the primary QEMU after each side's guest unbound its NIC")
	c.waitState(p, failover.Fenced, 10*time.Second)
}

// guestExec has the guest agent of m's side (through m's own libvirt) start script in the guest,
// as root, and returns without waiting for it.
func guestExec(m *member, script string) error {
	arg, err := json.Marshal(map[string]any{"execute": "guest-exec",
		"arguments": map[string]any{"path": "/bin/sh", "arg": []string{"-c", script}}})
	if err != nil {
		return err
	}
	out, err := m.lv.Virsh("qemu-agent-command", "--timeout", "10", domainName(m), string(arg))
	if err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	return nil
}

// waitNIC waits up to limit for m's NIC to be disabled (or enabled), and says whether it is.
func waitNIC(t testing.TB, m *member, disabled bool, limit time.Duration) bool {
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if nicDisabled(t, m) == disabled {
			return true
		}
	}
	return false
}

// nicEnabledAfterCheckpoint checks that the secondary s's NIC is enabled once a checkpoint later
// than the from-th has loaded the primary's enabled device into it.
func (c *cluster) nicEnabledAfterCheckpoint(s *member, from int, what string) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for c.checkpointCount() <= from || nicDisabled(c.t, s) {
		if time.Now().After(deadline) {
			c.dump()
			c.t.Fatalf("%s: the secondary's NIC is still disabled %d checkpoints later, while the primary's is enabled", what, c.checkpointCount()-from)
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Logf("%s: the secondary's NIC was enabled again by checkpoint %d", what, c.checkpointCount())
}

// libvirtNIC is the QOM path of the virtio device of the member's NIC on the libvirt stack (the
// NIC of alias ua-default).
const libvirtNIC = "/machine/peripheral/ua-default/virtio-backend"

// nicDisabled is the virtio "disabled" flag of m's NIC (on the libvirt stack).
func nicDisabled(t testing.TB, m *member) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var st struct {
		Disabled bool `json:"disabled"`
	}
	if err := m.launcher.Execute(ctx, "x-query-virtio-status", map[string]any{"path": libvirtNIC}, &st); err != nil {
		t.Fatalf("%s: %v", m.name, err)
	}
	return st.Disabled
}
