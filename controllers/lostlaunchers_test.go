package controllers

import (
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/health"
)

// TestALostMembersLauncherIsReleasedOnlyOnceTheRecordShowsItStopped: the launcher pod of a member
// being deleted is deleted at once only where its node is lost and the pair's record proves that
// nothing of the member runs the VM; otherwise the operator waits, and says how long where it
// knows.
func TestALostMembersLauncherIsReleasedOnlyOnceTheRecordShowsItStopped(t *testing.T) {
	lost := health.Verdict{State: health.Lost, Reason: health.ReasonNodeNotReady}
	suspect := health.Verdict{State: health.Suspect, Reason: health.ReasonNodeNotReady, RecheckAfter: 4 * time.Second}
	ready := health.Verdict{State: health.Running}
	for _, c := range []struct {
		name     string
		node     health.Verdict
		holder   string
		termLeft time.Duration
		ok       bool
		wait     time.Duration
	}{
		{"node Ready: its kubelet ends the pod", ready, "vm-2", 0, false, 0},
		{"node suspect: looked at again when it would be lost", suspect, "vm-2", 0, false, 4 * time.Second},
		{"node lost, another member holds the record", lost, "vm-2", 0, true, 0},
		{"node lost, the member still holds the record", lost, "vm-1", 0, false, 0},
		{"node lost, no holder, its term not over", lost, "", 12 * time.Second, false, 12 * time.Second},
		{"node lost, no holder for a whole term", lost, "", 0, true, 0},
		{"node deleted, another member holds the record", health.Verdict{State: health.Lost, Reason: health.ReasonNodeDeleted}, "vm-2", 0, true, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			ok, wait := launcherReleasable("vm-1", c.node, c.holder, c.termLeft)
			if ok != c.ok || wait != c.wait {
				t.Errorf("launcherReleasable = %v, %s; want %v, %s", ok, wait, c.ok, c.wait)
			}
		})
	}
}
