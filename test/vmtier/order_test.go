//go:build linux && vmtier

package vmtier

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/testnet"
)

// TestColoReleasesTheGuestsPacketsInOrder: colo-compare queues what it releases for a coroutine
// that writes it to the primary's NIC, and when that socket is full the coroutine sleeps while the
// queue grows. QEMU took the newest packet first, so that whatever queued meanwhile left in
// reverse: at each checkpoint's flush, and under any stream that fills the socket. The client then
// received a guest's TCP stream out of order and asked for what it already had (2207 and 998
// segments out of order in the benchmark's transmit rows, docs/performance.md), and the guest
// retransmitted and halved its window although nothing was lost. lockstep's QEMU takes the oldest
// first (hack/qemu/colo-compare-send-in-order.patch).
//
// The client reads one stream from the guest's bulk service for 10 s, across checkpoints, and its
// kernel must not have queued a single segment out of order: nothing on the path from the primary's
// NIC to the client (a tap, a bridge and a veth of this host) drops or reorders.
func TestColoReleasesTheGuestsPacketsInOrder(t *testing.T) {
	c, cl, p, s := protectedPairOf(t, 2, direct, busybox)
	const span = 10 * time.Second
	before := countPair(t, c, p, s)
	received := streamFromGuest(t, c, span)
	d := countPair(t, c, p, s).since(before)
	t.Logf("%.1f MB/s from the guest, %d checkpoints (colo-compare asked for %d on a mismatch, %d on a timeout)",
		float64(received)/1e6/span.Seconds(), d.checkpoints, d.causes.Mismatch, d.causes.Timeout)
	if d.checkpoints < 2 {
		t.Fatalf("%d checkpoints during the stream: nothing was flushed at a checkpoint", d.checkpoints)
	}
	if ofo := d.tcp["TCPOFOQueue"]; ofo != 0 {
		t.Fatalf("the client queued %d segments of the guest's stream out of order (and received %d twice)", ofo, d.tcp["TCPDSACKOldSent"])
	}
	cl.next("the pair serves on", time.Minute)
}

// streamFromGuest reads what the guest's bulk service sends on one connection for d, and returns
// how many bytes came.
func streamFromGuest(t *testing.T, c *cluster, d time.Duration) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	conn, err := testnet.DialContext(ctx, c.client, "tcp", net.JoinHostPort(c.vmAddr, strconv.Itoa(bulkPort)))
	if err != nil {
		t.Fatalf("the bulk service: %v", err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(d))
	if _, err := fmt.Fprintf(conn, "send %d\n", 4<<20); err != nil { // 4 GiB: more than 10 s of it
		t.Fatalf("the bulk service: %v", err)
	}
	n, err := io.Copy(io.Discard, conn)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the bulk service's stream ended after %d bytes: %v", n, err)
	}
	return n
}
