package lockstepd

import (
	"testing"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/failover"
)

// TestSideStatesAreTheAPIs checks that every failover state is reported under a name the CRD
// accepts (report writes State.String()).
func TestSideStatesAreTheAPIs(t *testing.T) {
	api := map[ftv1.SideState]bool{ftv1.SideProtected: true, ftv1.SideReplicating: true, ftv1.SideClaiming: true, ftv1.SideAlone: true, ftv1.SideFenced: true}
	for s := failover.Protected; s <= failover.Fenced; s++ {
		if !api[ftv1.SideState(s.String())] {
			t.Errorf("failover state %s has no SideState", s)
		}
	}
}
