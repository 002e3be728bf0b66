//go:build linux && vmtier

package vmtier

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/failover"
)

// TestLibvirtSecondaryFollowsTheGuestsDevices: under COLO the guest, twenty times, flips a coin
// and on heads unbinds its NIC's PCI function from the virtio-pci driver (which turns its bus
// mastering off and disables the virtio device) and binds it again two seconds later, as Linux
// does when it probes a device at boot or reloads a driver. Each side's guest flips its own coin
// (the microseconds of its clock when it asks, which differ between the two sides):
// when the secondary's unbinds and the primary's does not, the next checkpoint loads the primary's
// device state, which leaves the "disabled" flag out (QEMU sends it only when it is set), into a
// secondary device that has it set. A secondary that kept the flag went live with its NIC dead
// (hack/qemu/virtio-load-flag-defaults.patch); a VM protected while its kernel probed its devices
// hit it by chance. The test watches both NICs until the secondary's was disabled while the
// primary's was not across a checkpoint: it then ends at once, or stays disabled for longer than
// the guest's own unbinding lasts (the flag left behind). The test then stops the rounds, kills the
// primary's QEMU, and the secondary must serve.
func TestLibvirtSecondaryFollowsTheGuestsDevices(t *testing.T) {
	c, cl, p, s := protectedPairOf(t, 2, viaLibvirt, debian)
	script := `pci=$(basename $(readlink -f /sys/class/net/eth0/device/..))
addr=$(ip -4 -o addr show eth0 | awk '{print $4}')
(for i in $(seq 1 20); do
  [ -e /run/stop-unbinding ] && break
  if [ $(($(date +%N) / 1000 % 2)) = 0 ]; then
    echo $pci >/sys/bus/pci/drivers/virtio-pci/unbind; sleep 2; echo $pci >/sys/bus/pci/drivers/virtio-pci/bind
    sleep 1; ip addr add $addr dev eth0; ip link set eth0 up
  else
    sleep 3
  fi
  sleep 1
done) >/dev/null 2>&1 &`
	// An episode: samples in a row with the secondary's NIC disabled and the primary's not. One
	// that outlasts the guest's own unbinding (2 s) is a flag the checkpoints left behind; one that
	// spans a checkpoint and ends is a secondary that took the primary's flag from it. The coins
	// may take more than twenty rounds to fall so (in 3 of 7 runs of twenty they did not): up to
	// six runs of them.
	var diverged, stale, spanned, from int
	for run := 0; run < 6 && stale < 16 && spanned == 0; run++ {
		toggle := c.debian.ssh(c.client, c.vmAddr, "sudo sh")
		toggle.Stdin = strings.NewReader(script)
		if out, err := toggle.CombinedOutput(); err != nil {
			t.Fatalf("unbinding and binding the NIC in the guest: %v\n%s", err, out)
		}
		for end := time.Now().Add(85 * time.Second); time.Now().Before(end) && stale < 16 && spanned == 0; time.Sleep(250 * time.Millisecond) {
			switch {
			case nicDisabled(t, s) && !nicDisabled(t, p):
				if stale == 0 {
					from = c.checkpointCount()
				}
				diverged++
				stale++
			case stale > 0 && c.checkpointCount() > from:
				spanned, stale = c.checkpointCount()-from, 0
			default:
				stale = 0
			}
		}
	}
	if stale < 16 && spanned == 0 {
		t.Fatalf("no checkpoint came while the secondary's NIC alone was disabled (%d samples of it): the coins never came up so", diverged)
	}
	t.Logf("the secondary's NIC was disabled while the primary's was not in %d samples; the last %d in a row; %d checkpoints during the last such time before it ended", diverged, stale, spanned)
	// No more rounds: a later unbinding and binding on the side that goes live would turn its NIC
	// on again, whatever the checkpoints left.
	if out, err := c.debian.ssh(c.client, c.vmAddr, "sudo touch /run/stop-unbinding").CombinedOutput(); err != nil {
		t.Fatalf("stopping the rounds: %v\n%s", err, out)
	}
	time.Sleep(5 * time.Second) // the round under way ends
	for range 3 {
		cl.next("the primary serves with its NIC bound", time.Minute)
	}
	killed := time.Now()
	p.killQEMU()
	failedOver(t, c, cl, p, s, killed, "kill -9 of the primary QEMU after the guests unbound and bound their NICs")
	c.waitState(p, failover.Fenced, 10*time.Second)
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
