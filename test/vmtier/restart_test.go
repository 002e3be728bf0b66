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
