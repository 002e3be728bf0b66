//go:build linux && vmtier

package vmtier

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/colo"
	"github.com/lockstep-dev/lockstep/internal/failover"
)

// TestColoASecondaryOnAnEarlierSecondarysCopiesCatchesUp: the secondary's QEMU dies, and the
// primary runs on alone while the guest writes its counts to both disks. A new secondary then
// starts on the dead secondary's copies (as an operator gives a replacement the copies of a
// fenced secondary), and the primary copies into them only what the VM wrote since they were
// whole (blockdev-backup of its dirty bitmaps), not the whole disks. Then the primary's QEMU is
// killed: the new secondary goes live with both disks holding the last acknowledged count, and
// the data disk holding what was written to it only while the primary ran alone (a region the
// guest never writes again, so that no later replicated write could have brought it).
func TestColoASecondaryOnAnEarlierSecondarysCopiesCatchesUp(t *testing.T) {
	c, cl, p, s := protectedPairOf(t, 3, direct, busyboxTwoDisks)
	full := p.engine.Streams().LastResync
	if full.Incremental || full.Member != s.name || full.Bytes < 2*diskSize {
		t.Fatalf("the first resync: %+v, want the whole of both %d-byte disks copied into %s", full, diskSize, s.name)
	}
	s.killQEMU()
	c.waitState(p, failover.Alone, time.Minute)
	c.waitState(s, failover.Fenced, 10*time.Second)
	for range 10 {
		cl.next("the primary serves alone", time.Minute)
	}
	// Written while alone, where the guest never writes (its counter is the disk's first sector).
	const aloneAt, aloneLen, pattern = 1 << 20, 64 << 10, 0xab
	ioOn(t, p, fmt.Sprintf("write -P %#x %d %d", pattern, aloneAt, aloneLen))

	s2 := c.protectOn(p, c.nodes[2], s)
	inc := p.engine.Streams().LastResync
	t.Logf("resync into %s, whole disks: %d bytes in %s; into %s on %s's copies: %d bytes in %s",
		full.Member, full.Bytes, full.Took.Round(time.Millisecond), inc.Member, s.name, inc.Bytes, inc.Took.Round(time.Millisecond))
	if !inc.Incremental || inc.Member != s2.name || inc.Bytes == 0 || inc.Bytes*8 > full.Bytes {
		t.Fatalf("the resync into the secondary on %s's copies: %+v, want an incremental one of what the guest wrote since (under an eighth of the whole %d bytes)", s.name, inc, full.Bytes)
	}
	for range 5 {
		cl.next("the primary serves under COLO again", time.Minute)
	}
	killed := time.Now()
	p.killQEMU()
	failedOver(t, c, cl, p, s2, killed, "kill -9 of the primary QEMU")
	c.readDisks(t, s2, func(read func(i int, command string) string) {
		// A pattern that differs fails qemu-io, and the test with it.
		if out := read(1, fmt.Sprintf("read -P %#x %d %d", pattern, aloneAt, aloneLen)); strings.Contains(out, "Pattern verification failed") {
			t.Fatalf("the data disk on %s lacks what was written while the primary ran alone:\n%s", s2.name, out)
		}
	})
}

// ioOn runs a qemu-io command on member m's data disk (colo.DiskNode(1)) through its QEMU's block
// layer, as a guest's write would go (and be tracked).
func ioOn(t testing.TB, m *member, command string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out string
	if err := m.launcher.Execute(ctx, "human-monitor-command", map[string]any{"command-line": fmt.Sprintf("qemu-io %s %q", colo.DiskNode(1), command)}, &out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "error") || strings.Contains(out, "failed") {
		t.Fatalf("qemu-io %q on %s: %s", command, m.name, out)
	}
}
