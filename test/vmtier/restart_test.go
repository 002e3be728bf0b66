//go:build linux && vmtier

package vmtier

import (
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/failover"
)

// TestColoSurvivesLockstepdRestarts restarts lockstepd on each node of a protected pair in turn,
// as an upgrade of its DaemonSet would. The streams of COLO go through lockstepd, so a
// protection in progress ends with it; the VM must keep serving from one side, with nothing lost,
// and lockstepd must re-attach to the QEMU it did not launch and say what it found.
//
//  1. The secondary's lockstepd restarts: the primary goes on alone; the restarted lockstepd
//     finds its QEMU left in COLO, which can never be migrated into again, and stops it.
//  2. The VM is protected again, with a new secondary on the restarted node.
//  3. The primary's lockstepd restarts: exactly one side keeps the VM (the primary, if its new
//     lockstepd reclaims the record before the secondary hears the silence; else the secondary
//     goes live) and the other is fenced, its QEMU stopped.
func TestColoSurvivesLockstepdRestarts(t *testing.T) {
	c, cl, p, s := protectedPair(t, 2, direct)

	c.restartLockstepd(s.node)
	c.waitState(s, failover.Fenced, time.Minute)
	t.Logf("the restarted lockstepd fenced the secondary it found: %s", s.agent.Status().Message)
	c.waitState(p, failover.Alone, time.Minute)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the fenced secondary's QEMU still runs")
	}
	cl.serveFor("the primary serves alone after its secondary's lockstepd restarted", 5*time.Second)

	start := time.Now()
	s2 := c.protect(p, s.node)
	t.Logf("protected again %s after a new secondary started beside the restarted lockstepd", time.Since(start).Round(time.Millisecond))
	for range 5 {
		cl.next("the primary serves under COLO again", time.Minute)
	}

	c.restartLockstepd(p.node)
	winner, loser := cl.untilOneSideRuns(p, s2, "the primary's lockstepd restarted")
	t.Logf("after the primary's lockstepd restarted, %s runs the VM; %s is fenced: %s", winner.name, loser.name, loser.agent.Status().Message)
	cl.serveFor("the side that kept the VM serves", 10*time.Second)
	cl.checkDisk(winner)
}

// goLiveSurvivesALockstepdCrash: the secondary's lockstepd won the pair's record (its primary's
// node was lost) and died before its QEMU went live. The VM's only copy is that secondary, still
// in COLO with its packet redirectors in place. The next lockstepd finds the record naming the
// member and starts it as the primary it is: it must finish the go-live, so that the VM serves
// the next count on the same boot with its disk holding it, not leave the guest's replies
// redirected to a primary that is gone.
func goLiveSurvivesALockstepdCrash(t *testing.T, on stack) {
	c, cl, p, s := protectedPair(t, 2, on)

	// The secondary's lockstepd dies, and at once the primary's node: the primary can release
	// nothing more (no checkpoint reaches the secondary) and its lockstepd has no time to claim.
	c.stopLockstepd(s.node)
	c.crashNode(p.node)
	lost := time.Now()
	// What the secondary's lockstepd did before it died: it won the record at the next epoch.
	won := c.lease.Holder().Epoch + 1
	c.lease.Hold(s.spec.Identity, won)
	// The next lockstepd reads the record and starts the member as the primary (lockstepd's
	// ensureAgent does the same in a cluster).
	s.spec.Primary = true
	c.restartLockstepd(s.node)

	at := cl.next("the secondary whose go-live a lockstepd crash interrupted serves", time.Minute)
	t.Logf("the loss of the primary's node to the first reply, across the secondary's lockstepd restart: %s", at.Sub(lost).Round(time.Millisecond))
	cl.serveFor("the member that finished its go-live serves", 10*time.Second)
	cl.checkDisk(s)
	if h := c.lease.Holder(); h.Identity != s.spec.Identity || h.Epoch < won {
		t.Fatalf("the record: %+v, want %s at epoch %d or later", h, s.spec.Identity, won)
	}
}
