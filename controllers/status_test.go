package controllers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/health"
)

// TestProtection: the pair's state and Protected condition from its members, among them a new
// COLO pair whose secondary waits for its primary's disk sizes (Starting, not NotProtected: it
// follows by itself) and a secondary whose lockstepd stopped (suspect: not Protected).
func TestProtection(t *testing.T) {
	member := func(name string, st health.State, synced bool) *memberView {
		v := &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}}}
		if synced {
			v.Annotations[ftv1.AnnotationSyncedAt] = "2026-11-26T10:00:00Z"
		}
		verdict := health.Verdict{State: st, Reason: "Running"}
		if st == health.Suspect {
			verdict.Reason = health.ReasonLockstepdNotRunning
		}
		return &memberView{vmi: v, node: "node-" + name, verdict: verdict}
	}
	ftvm := &ftv1.FaultTolerantVM{}
	for _, c := range []struct {
		name    string
		s       *scope
		sReason string
		state   ftv1.FTState
		ok      bool
		reason  string
	}{
		{"both running, the secondary synchronized", &scope{ftvm: ftvm, primary: member("p", health.Running, false), secondary: member("s", health.Running, true)},
			ftv1.ReasonRunning, ftv1.StateProtected, true, ftv1.ReasonProtected},
		{"the secondary synchronizing", &scope{ftvm: ftvm, primary: member("p", health.Running, false), secondary: member("s", health.Running, false)},
			ftv1.ReasonRunning, ftv1.StateStarting, false, ftv1.ReasonSecondaryStarting},
		{"a new COLO pair: the secondary waits for the primary's disk sizes", &scope{ftvm: ftvm, primary: member("p", health.Running, false)},
			ftv1.ReasonWaitingForDiskSizes, ftv1.StateStarting, false, ftv1.ReasonWaitingForDiskSizes},
		{"the secondary's lockstepd stopped: suspect, and nothing replicates", &scope{ftvm: ftvm, primary: member("p", health.Running, false), secondary: member("s", health.Suspect, true)},
			health.ReasonLockstepdNotRunning, ftv1.StateNotProtected, false, health.ReasonLockstepdNotRunning},
		{"no node for the secondary", &scope{ftvm: ftvm, primary: member("p", health.Running, false)},
			ftv1.ReasonNoEligibleNode, ftv1.StateNotProtected, false, ftv1.ReasonNoEligibleNode},
		{"a disk no secondary can match", &scope{ftvm: ftvm, primary: member("p", health.Running, false)},
			ftv1.ReasonDiskSizeUnsupported, ftv1.StateNotProtected, false, ftv1.ReasonDiskSizeUnsupported},
		{"the primary cut from the API server, its term running on its own renewal", &scope{ftvm: ftvm, primary: member("p", health.Lost, false), secondary: member("s", health.Running, true),
			termWait: &termWait{holder: "p", by: "node-p/p"}},
			ftv1.ReasonRunning, ftv1.StateNotProtected, false, ftv1.ReasonWaitingForRecordTerm},
		{"the primary cut from the API server, its synchronized secondary renewing for it", &scope{ftvm: ftvm, primary: member("p", health.Lost, false), secondary: member("s", health.Running, true),
			termWait: &termWait{holder: "p", by: "node-s/s"}},
			ftv1.ReasonRunning, ftv1.StateProtected, true, ftv1.ReasonWitnessedBySecondary},
		{"the primary cut, renewed for by a secondary not synchronized (it never renews)", &scope{ftvm: ftvm, primary: member("p", health.Lost, false), secondary: member("s", health.Running, false),
			termWait: &termWait{holder: "p", by: "node-s/s"}},
			ftv1.ReasonRunning, ftv1.StateNotProtected, false, ftv1.ReasonWaitingForRecordTerm},
	} {
		state, ok, reason, _ := protection(c.s, false, ftv1.ReasonRunning, "", c.sReason, "")
		if state != c.state || ok != c.ok || reason != c.reason {
			t.Errorf("%s: %s, %v, %s; want %s, %v, %s", c.name, state, ok, reason, c.state, c.ok, c.reason)
		}
	}
}
