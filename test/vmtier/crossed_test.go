//go:build linux && vmtier

package vmtier

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/testnet"
	"github.com/lockstep-dev/lockstep/test/counter"
)

// windowsPort is the guest's windows service (hack/guest/windows): "W X" is answered "ok" once the
// guest's uptime is in a window of W seconds whose number is X modulo 2.
const windowsPort = counter.Port + 3

// TestColoCheckpointsWhenTheGuestsWaitCrossed: two guests can each hold what the other gave away
// (the OLTP row's PostgreSQL backends, granting a row lock to one transaction on the primary and
// to another on the secondary: docs/performance.md), and each one's reply then waits for a
// counterpart that only a checkpoint brings. lockstep's QEMU checkpoints once data of each side has
// waited crossed, the primary's on one connection and the secondary's on another, for the pair's
// crossed wait (hack/qemu/colo-compare-waits-crossed.patch), rather than after the whole compare
// timeout.
//
// The windows service answers by the guest's clock, which stops while its VM is stopped: after
// the secondary's VM stood still for one window, the two members are a window apart, and of two
// requests sent at once, "W 0" and "W 1", each answers at once the one that the other does not.
// The period and the compare timeout are 30 s and the crossed wait 300 ms: a checkpoint must come
// for the crossed wait, none for a timeout or a mismatch. Without the crossed wait nothing forces
// one: each answer waits until the other member's window comes round.
func TestColoCheckpointsWhenTheGuestsWaitCrossed(t *testing.T) {
	c, cl, p, s := protectedPairOf(t, 2, direct, busybox, func(c *cluster) {
		c.period, c.compareTimeout, c.crossedWait = 30*time.Second, 30*time.Second, 300*time.Millisecond
		c.guestNoIPv6 = true
	})
	// An ARP packet is one colo-compare cannot compare: it holds it and checkpoints.
	ip(t, "-n", c.client, "neigh", "replace", c.vmAddr, "lladdr", guestMAC, "nud", "permanent", "dev", c.clientIf)
	const trials = 3
	for trial := 1; ; trial++ {
		if waitedCrossed(t, c, p, s) {
			break
		}
		if trial == trials {
			c.dump()
			t.Fatalf("in none of %d trials did colo-compare checkpoint for the two members' answers waiting crossed", trials)
		}
	}
	cl.next("the pair serves on", time.Minute)
}

// waitedCrossed runs one trial of TestColoCheckpointsWhenTheGuestsWaitCrossed and says whether
// colo-compare checkpointed for the answers waiting crossed. It says false where the members were
// not a window apart when the requests came (a checkpoint between the secondary's stop and the
// requests makes them the same again, and the windows' edges come at times of their own), and fails
// the test where a checkpoint came for anything else.
func waitedCrossed(t *testing.T, c *cluster, p, s *member) bool {
	const window = 4 // seconds
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var conns [2]net.Conn
	for i := range conns {
		conn, err := testnet.DialContext(ctx, c.client, "tcp", net.JoinHostPort(c.vmAddr, strconv.Itoa(windowsPort)))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		conns[i] = conn
	}
	time.Sleep(time.Second) // the connections' last ACKs compared
	if err := s.launcher.Execute(ctx, "stop", nil, nil); err != nil {
		t.Fatalf("stopping the secondary's VM: %v", err)
	}
	time.Sleep(window * time.Second)
	before := causesOf(t, p)
	if err := s.launcher.Execute(ctx, "cont", nil, nil); err != nil {
		t.Fatalf("starting the secondary's VM again: %v", err)
	}
	answers := make(chan error, len(conns))
	for i, conn := range conns {
		go func() {
			_ = conn.SetDeadline(time.Now().Add(3 * window * time.Second))
			if _, err := fmt.Fprintf(conn, "%d %d\n", window, i); err != nil {
				answers <- err
				return
			}
			line, err := bufio.NewReader(conn).ReadString('\n')
			if err == nil && strings.TrimSpace(line) != "ok" {
				err = fmt.Errorf("answered %q", line)
			}
			answers <- err
		}()
	}
	for range conns {
		if err := <-answers; err != nil {
			c.dump()
			t.Fatalf("the windows service: %v", err)
		}
	}
	d := causesSince(causesOf(t, p), before)
	if d.Timeout != 0 || d.Mismatch != 0 {
		c.dump()
		t.Fatalf("colo-compare checkpointed %d times on a timeout and %d on a mismatch (%d for the answers waiting crossed): "+
			"only the crossed wait should have forced one", d.Timeout, d.Mismatch, d.Crossed)
	}
	t.Logf("colo-compare checkpointed %d times for the answers waiting crossed", d.Crossed)
	return d.Crossed > 0
}
