//go:build linux && vmtier

package vmtier

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/failover"
	"github.com/lockstep-dev/lockstep/internal/testnet"
)

// TestASecondaryStartedBeforeItsPrimaryProtectsGetsThePrimarysPackets: a secondary's QEMU dials
// its packet streams as soon as it starts, through its lockstepd, which carries them to the
// primary's; the primary's lockstepd routes them only once its engine protects with that
// secondary, which can come seconds later (the operator's view of a new member reaches the two
// nodes at different times). QEMU's filter-redirector stops reading its socket for good at the
// first disconnect, although the chardev reconnects: when the relay closed a refused connection,
// the secondary never read the primary's mirrored packets again, the mirror filled, and the
// primary's filter-mirror, which writes with the VM's lock held, stopped the whole VM (the full
// stack's first spec, 2026-11-28: frozen at its first client's setup). The relay now holds a
// secondary's packet stream open until the primary routes it (relay.Forward.Once).
//
// The secondary starts, and its QEMU dials for 3 s before the primary hears of it; once protected,
// 64 MB come in to the VM, far more than the sockets on the way hold, and the VM must still answer.
func TestASecondaryStartedBeforeItsPrimaryProtectsGetsThePrimarysPackets(t *testing.T) {
	c, cl, p := bootOf(t, 2, direct, busybox)
	s := c.start(c.nodes[1], false, p)
	time.Sleep(3 * time.Second) // QEMU's packet streams redial every second
	p.run.SetPeer(context.Background(), s.asPeer())
	c.waitState(p, failover.Protected, 5*time.Minute)
	cl.next("the pair serves under COLO", time.Minute)

	const incoming = 64 << 20
	conn, err := testnet.DialContext(context.Background(), c.client, "udp", net.JoinHostPort(c.vmAddr, "9"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	datagram := make([]byte, 1400)
	for sent := 0; sent < incoming; sent += len(datagram) {
		// The guest's port unreachable comes back as a refused write: the datagram went.
		if _, err := conn.Write(datagram); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("after %d bytes to the VM: %v", sent, err)
		}
		if sent%(256<<10) == 0 {
			time.Sleep(20 * time.Millisecond) // a pace the TCG guest keeps up with
		}
	}
	for range 3 {
		cl.next("the VM answers after 64 MB came in (its primary mirrored them to a secondary that reads them)", time.Minute)
	}
}
