package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/placement"
)

func vm(state ftv1.FTState, protected metav1.ConditionStatus, reason string) *ftv1.FaultTolerantVM {
	f := &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm"}}
	f.Spec.RunStrategy = ftv1.RunStrategyRunning
	f.Status.State = state
	f.Status.Conditions = []metav1.Condition{{Type: ftv1.ConditionProtected, Status: protected, Reason: reason}}
	return f
}

func TestObserveKeepsOneUnprotectedSeriesWithItsReason(t *testing.T) {
	defer Forget("ns", "vm")
	Observe(vm(ftv1.StateNotProtected, metav1.ConditionFalse, ftv1.ReasonNoEligibleNode))
	if got := testutil.ToFloat64(Unprotected.WithLabelValues("ns", "vm", ftv1.ReasonNoEligibleNode)); got != 1 {
		t.Fatalf("unprotected{reason=NoEligibleNode} = %v", got)
	}
	Observe(vm(ftv1.StateNotProtected, metav1.ConditionFalse, ftv1.ReasonSecondaryLost))
	if n := testutil.CollectAndCount(Unprotected); n != 1 {
		t.Fatalf("%d unprotected series after the reason changed, want 1", n)
	}
	p := vm(ftv1.StateProtected, metav1.ConditionTrue, ftv1.ReasonProtected)
	p.Status.VLockstepInterval = &metav1.Duration{Duration: 20 * time.Millisecond}
	bw := resource.MustParse("83k")
	p.Status.LogBandwidth = &bw
	Observe(p)
	if n := testutil.CollectAndCount(Unprotected); n != 0 {
		t.Fatalf("%d unprotected series for a protected VM", n)
	}
	if got := testutil.ToFloat64(Interval.WithLabelValues("ns", "vm")); got != 0.02 {
		t.Fatalf("interval %v", got)
	}
	if got := testutil.ToFloat64(Bandwidth.WithLabelValues("ns", "vm")); got != 83000 {
		t.Fatalf("bandwidth %v", got)
	}
	halted := vm(ftv1.StateStopped, metav1.ConditionFalse, ftv1.ReasonHalted)
	halted.Spec.RunStrategy = ftv1.RunStrategyHalted
	Observe(halted)
	if n := testutil.CollectAndCount(Unprotected); n != 0 {
		t.Fatalf("a halted VM counts as unprotected")
	}
	Forget("ns", "vm")
	if n := testutil.CollectAndCount(Interval) + testutil.CollectAndCount(State); n != 0 {
		t.Fatalf("%d series left after Forget", n)
	}
}

func TestObserveNodesDropsNodesNoLongerSeen(t *testing.T) {
	ObserveNodes([]placement.Node{{Name: "a", Limits: placement.Limits{MaxMembers: 4, LogBandwidthMbps: 1000}, Members: []placement.Member{{Pair: "p"}}}, {Name: "b"}})
	want := `
# HELP lockstep_node_ft_members FT members (primaries and secondaries) on a node, as placement last saw it.
# TYPE lockstep_node_ft_members gauge
lockstep_node_ft_members{node="a"} 1
lockstep_node_ft_members{node="b"} 0
# HELP lockstep_node_ft_members_limit A node's FT VM limit, as placement last saw it.
# TYPE lockstep_node_ft_members_limit gauge
lockstep_node_ft_members_limit{node="a"} 4
lockstep_node_ft_members_limit{node="b"} 0
`
	if err := testutil.CollectAndCompare(Nodes, strings.NewReader(want), "lockstep_node_ft_members", "lockstep_node_ft_members_limit"); err != nil {
		t.Fatal(err)
	}
	ObserveNodes([]placement.Node{{Name: "a"}})
	if n := testutil.CollectAndCount(Nodes, "lockstep_node_log_bandwidth_budget_mbps"); n != 1 {
		t.Fatalf("%d budget series, want 1 (node b is gone)", n)
	}
	// Registered with the operator's registry under the names the alerts use.
	if n, err := testutil.GatherAndCount(metrics.Registry, "lockstep_node_log_bandwidth_budget_mbps"); err != nil || n != 1 {
		t.Fatalf("%d budget series served, %v; want 1", n, err)
	}
}
