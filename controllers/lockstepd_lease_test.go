package controllers

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/health"
	"github.com/lockstep-dev/lockstep/internal/member"
	"github.com/lockstep-dev/lockstep/internal/roles"
)

// TestUnderCOLOASecondaryWhoseLockstepdStoppedIsNeverPromoted: lockstepd on the secondary's node
// stopped renewing its node lease (its address stays on the Node). Under COLO the secondary is
// suspect from when the lease ran out, so that when its primary is lost the pair waits for it
// rather than promote a member whose go-live no lockstepd can carry out; a grace later it is lost,
// and the VM restarts from its disks. Without COLO nothing changes.
func TestUnderCOLOASecondaryWhoseLockstepdStoppedIsNeverPromoted(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	grace := time.Minute
	ftvm := &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: "vm-uid"}}
	vmi := func(name, role, node string) *virtv1.VirtualMachineInstance {
		v := &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name,
			Labels:      map[string]string{ftv1.LabelPair: "vm", ftv1.LabelRole: role, ftv1.LabelNode: node, ftv1.LabelManagedBy: ftv1.ManagedByValue},
			Annotations: map[string]string{ftv1.AnnotationSyncedAt: now.Add(-time.Hour).Format(time.RFC3339), ftv1.AnnotationFollows: "vm-1"}},
			Status: virtv1.VirtualMachineInstanceStatus{Phase: virtv1.Running, NodeName: node}}
		v.OwnerReferences = []metav1.OwnerReference{{APIVersion: ftv1.GroupVersion.String(), Kind: "FaultTolerantVM", Name: "vm", UID: ftvm.UID, Controller: ptr.To(true)}}
		return v
	}
	node := func(name string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{ftv1.AnnotationNodeLoggingAddress: "10.0.0.1:7410"}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	}
	lease := func(nodeName string, renewed time.Time) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "lockstep-system", Name: ftv1.NodeLeaseName(nodeName),
			Labels: map[string]string{ftv1.LabelManagedBy: ftv1.ManagedByValue}},
			Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: renewed}, LeaseDurationSeconds: ptr.To(int32(ftv1.NodeLeaseDurationSeconds))}}
	}
	for _, c := range []struct {
		name     string
		colo     bool
		ranOut   time.Duration // how long ago the secondary's node lease ran out
		want     health.State
		decision func(roles.Plan) bool
	}{
		{"COLO, the lease ran out 20s ago: suspect; the pair waits for it", true, 20 * time.Second, health.Suspect,
			func(p roles.Plan) bool { return p.Waiting && p.Relabel == "" && !p.Restart }},
		{"COLO, the lease ran out a grace ago: lost; the VM restarts from its disks", true, grace, health.Lost,
			func(p roles.Plan) bool { return p.Restart && p.Relabel == "" }},
		{"without COLO: the secondary is promoted", false, grace, health.Running,
			func(p roles.Plan) bool { return p.Relabel == "vm-2" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			renewed := now.Add(-c.ranOut - ftv1.NodeLeaseDurationSeconds*time.Second)
			primaryNode := node("node-a")
			primaryNode.Status.Conditions[0].Status = corev1.ConditionFalse // the primary's node went down
			primaryNode.Status.Conditions[0].LastTransitionTime = metav1.NewTime(now.Add(-2 * grace))
			cl := fake.NewClientBuilder().WithScheme(NewScheme()).
				WithObjects(ftvm, vmi("vm-1", ftv1.RolePrimary, "node-a"), vmi("vm-2", ftv1.RoleSecondary, "node-b"),
					primaryNode, node("node-b"), lease("node-b", renewed)).
				WithIndex(&virtv1.VirtualMachineInstance{}, indexMemberByPair, func(o client.Object) []string { return []string{o.GetLabels()[ftv1.LabelPair]} }).
				WithIndex(&ftv1.FaultTolerantVMOperation{}, indexOperationByFTVM, func(o client.Object) []string {
					return []string{o.(*ftv1.FaultTolerantVMOperation).Spec.FaultTolerantVMName}
				}).Build()
			// The operator saw the lease's last renewal when it was written: it dates it so, by
			// its own clock, whatever the renew time says.
			sightings := &Sightings{}
			nodeLeaseSeen(sightings, lease("node-b", renewed), renewed)
			r := &FaultTolerantVMReconciler{Client: cl, APIReader: cl, Scheme: NewScheme(), Clock: clocktesting.NewFakePassiveClock(now), Sightings: sightings,
				Config: Config{NodeLostGrace: grace, LockstepdNamespace: "lockstep-system", Member: member.Options{COLO: member.COLO{Enabled: c.colo}}}}
			s, err := r.observe(context.Background(), ftvm)
			if err != nil {
				t.Fatal(err)
			}
			sec := s.member("vm-2")
			if sec == nil || sec.verdict.State != c.want || (c.colo && sec.verdict.Reason != health.ReasonLockstepdNotRunning) {
				t.Fatalf("the secondary's verdict: %+v, want %s", sec, c.want)
			}
			rec := roles.Record{Exists: true, Holder: "vm-1", Epoch: 1}
			if plan := roles.Decide(rec, s.roleMembers()); !c.decision(plan) {
				t.Errorf("the decision once the primary is lost: %+v", plan)
			}
		})
	}
}

// TestSightingsDateAValueByTheOperatorsClock: a value keeps the time it was first seen; a new
// value is dated anew; the node's own time inside the value plays no part.
func TestSightingsDateAValueByTheOperatorsClock(t *testing.T) {
	var s Sightings
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	if got := s.Seen("lease/ns/a", "n1@2026-12-06T11:50:00Z", t0); !got.Equal(t0) {
		t.Fatalf("first sighting dated %s", got)
	}
	if got := s.Seen("lease/ns/a", "n1@2026-12-06T11:50:00Z", t0.Add(30*time.Second)); !got.Equal(t0) {
		t.Fatalf("the same value seen again is dated %s, want its first sighting", got)
	}
	if got := s.Seen("lease/ns/a", "n1@2026-12-06T11:50:10Z", t0.Add(40*time.Second)); !got.Equal(t0.Add(40 * time.Second)) {
		t.Fatalf("a renewal is dated %s, want when it was seen", got)
	}
	s.Forget("lease/ns/a")
	if got := s.Seen("lease/ns/a", "n1@2026-12-06T11:50:10Z", t0.Add(50*time.Second)); !got.Equal(t0.Add(50 * time.Second)) {
		t.Fatalf("after Forget: %s", got)
	}
}
