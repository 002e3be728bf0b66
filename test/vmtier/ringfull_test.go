//go:build linux && vmtier

package vmtier

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/testnet"
	"github.com/lockstep-dev/lockstep/test/counter"
)

// sinkPort is the guest's sink service (hack/guest/sink): it reads a connection until the client
// closes it.
const sinkPort = counter.Port + 4

// TestColoKeepsWhatItsNICCouldNotTakeAtACheckpoint: when the guest's receive ring is full, QEMU
// queues the packet the tap gave it for the NIC and stops reading the tap. A checkpoint stops the
// primary's VM, and QEMU's net layer, at every stop, flushed that queue to the NIC, whose VM no
// longer ran: virtio-net refused the packet, the flush freed it, and the packet was gone (with
// TSO up to 64 KiB of a TCP stream, which the sender had to send again on the receiver's
// duplicate acknowledgements, halving its window). The benchmark's receive row lost one at about
// a third of its checkpoints (docs/performance.md). lockstep's QEMU keeps it queued through a
// COLO checkpoint, for the NIC once the VM runs, and filter-mirror sends the secondary, whose
// checkpoint does not hold it, its copy after the checkpoint, with those of the packets that came
// during the stop (hack/qemu/net-colo-keep-queued-at-checkpoint.patch).
//
// The client streams into the guest's sink for 10 s across checkpoints a few hundred milliseconds
// apart. At least one checkpoint must have found a packet queued (filter-mirror's trace, or the
// test proves nothing). The primary's net layer must not have dropped a packet its NIC refused
// (QEMU's trace event net_queue_refused, which the patch adds), and the client must not have sent
// more segments again on the guest's duplicate acknowledgements than the guest then told it came
// twice (D-SACKs): those were late, not lost. The host's path from the client's veth to the tap
// sometimes swaps two segments, unprotected too, which the client takes for a loss until the
// D-SACK (docs/colo.md, patch 19). The comparison is of totals: the duplicates of the client's
// tail-loss probes count too, 1 to 3 segments a run, well below the 45 of one lost 64 KiB packet.
func TestColoKeepsWhatItsNICCouldNotTakeAtACheckpoint(t *testing.T) {
	c, cl, p, s := protectedPairOf(t, 2, direct, busybox, func(c *cluster) {
		c.period = 300 * time.Millisecond
		c.trace = append(c.trace, "colo_filter_mirror_checkpoint_queued", "net_queue_refused")
	})
	const span = 10 * time.Second
	before := countPair(t, c, p, s)
	queuedBefore, refusedBefore := countInLog(t, p, "colo_filter_mirror_checkpoint_queued"), countInLog(t, p, "net_queue_refused")
	sent := streamIntoGuest(t, c, span)
	d := countPair(t, c, p, s).since(before)
	queued := countInLog(t, p, "colo_filter_mirror_checkpoint_queued") - queuedBefore
	refused := countInLog(t, p, "net_queue_refused") - refusedBefore
	again, twice := d.tcp["TCPFastRetrans"], d.tcp["TCPDSACKRecvSegs"]
	t.Logf("%.1f MB/s into the guest, %d checkpoints (colo-compare asked for %d on a mismatch, %d on a timeout), "+
		"after %d of them filter-mirror sent the secondary what waited in the primary's NIC's queue; the client sent %d "+
		"segments again on duplicate acknowledgements, and the guest told it of %d segments that came twice",
		float64(sent)/1e6/span.Seconds(), d.checkpoints, d.causes.Mismatch, d.causes.Timeout, queued, again, twice)
	if d.checkpoints < 2 {
		t.Fatalf("%d checkpoints during the stream", d.checkpoints)
	}
	if refused != 0 {
		t.Fatalf("the primary's net layer dropped %d packets that a receiver refused (filter-mirror sent what waited in the NIC's queue after %d checkpoints)", refused, queued)
	}
	if again > twice {
		t.Fatalf("the client sent %d segments again on the guest's duplicate acknowledgements, and the guest told it of only %d that came twice: at least %d were lost", again, twice, again-twice)
	}
	if queued == 0 {
		t.Fatalf("after none of %d checkpoints did filter-mirror send what waited in the primary's NIC's queue: the guest's receive ring was never full at one, and the test proves nothing", d.checkpoints)
	}
	cl.next("the pair serves on", time.Minute)
}

// streamIntoGuest writes zeros to the guest's sink service on one connection for d, then closes
// its side and waits for the sink to close: by then the guest has acknowledged every byte, and
// the client's TCP has counted what those acknowledgements told it. It returns how many bytes it
// wrote.
func streamIntoGuest(t *testing.T, c *cluster, d time.Duration) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := testnet.DialContext(ctx, c.client, "tcp", net.JoinHostPort(c.vmAddr, strconv.Itoa(sinkPort)))
	if err != nil {
		t.Fatalf("the sink service: %v", err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetWriteDeadline(time.Now().Add(d))
	buf := make([]byte, 1<<20)
	var n int64
	for {
		w, err := conn.Write(buf)
		n += int64(w)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatalf("the sink service took %d bytes: %v", n, err)
		}
	}
	tcp, ok := conn.(interface{ CloseWrite() error })
	if !ok {
		t.Fatalf("the sink service's connection is a %T, not TCP", conn)
	}
	if err := tcp.CloseWrite(); err != nil {
		t.Fatalf("closing the stream to the sink service: %v", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.Copy(io.Discard, conn); err != nil {
		t.Fatalf("the sink service did not close after the stream: %v", err)
	}
	return n
}
