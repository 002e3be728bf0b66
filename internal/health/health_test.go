package health

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

func TestJudge(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	grace := 40 * time.Second
	ago := func(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(-d)) }
	ready := func() *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastTransitionTime: ago(time.Hour)}}}}
	}
	notReadyFor := func(d time.Duration) *corev1.Node {
		n := ready()
		n.Status.Conditions[0].Status = corev1.ConditionUnknown
		n.Status.Conditions[0].LastTransitionTime = ago(d)
		return n
	}
	unreachableTaintFor := func(d time.Duration) *corev1.Node {
		n := ready()
		at := ago(d)
		n.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute, TimeAdded: &at}}
		return n
	}
	running := func() *virtv1.VirtualMachineInstance {
		return &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm-1"}, Status: virtv1.VirtualMachineInstanceStatus{Phase: virtv1.Running}}
	}
	withReady := func(reason string) *virtv1.VirtualMachineInstance {
		v := running()
		v.Status.Conditions = []virtv1.VirtualMachineInstanceCondition{{Type: virtv1.VirtualMachineInstanceReady, Status: corev1.ConditionFalse, Reason: reason}}
		return v
	}
	deleting := running()
	deleting.DeletionTimestamp = &metav1.Time{Time: now}
	failed := running()
	failed.Status.Phase = virtv1.Failed
	pending := running()
	pending.Status.Phase = ""

	cases := []struct {
		name   string
		vmi    *virtv1.VirtualMachineInstance
		node   *corev1.Node
		state  State
		reason string
	}{
		{"running on a ready node", running(), ready(), Running, "Running"},
		{"not started yet", pending, ready(), Pending, "Pending"},
		{"being deleted", deleting, ready(), Lost, ReasonVMIDeleted},
		{"ended", failed, ready(), Lost, ReasonVMIEnded},
		{"node deleted", running(), nil, Lost, ReasonNodeDeleted},
		{"pod not there", withReady(virtv1.PodNotExistsReason), ready(), Lost, virtv1.PodNotExistsReason},
		{"pod terminating", withReady(virtv1.PodTerminatingReason), ready(), Lost, virtv1.PodTerminatingReason},
		{"guest not ready for another reason is not a loss", withReady("GuestNotRunning"), ready(), Running, "Running"},
		{"node NotReady within grace", running(), notReadyFor(10 * time.Second), Suspect, ReasonNodeNotReady},
		{"node NotReady beyond grace", running(), notReadyFor(grace), Lost, ReasonNodeNotReady},
		{"unreachable taint within grace", running(), unreachableTaintFor(time.Second), Suspect, ReasonNodeUnreachable},
		{"unreachable taint beyond grace", running(), unreachableTaintFor(time.Minute), Lost, ReasonNodeUnreachable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := Judge(c.vmi, "n1", c.node, now, grace)
			if v.State != c.state || v.Reason != c.reason {
				t.Fatalf("got %s/%s (%s), want %s/%s", v.State, v.Reason, v.Message, c.state, c.reason)
			}
			if v.Message == "" {
				t.Error("no message")
			}
		})
	}
}

func TestSuspectSaysWhenToLookAgain(t *testing.T) {
	now := time.Now()
	n := &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(now.Add(-15 * time.Second))}}}}
	v := Judge(&virtv1.VirtualMachineInstance{Status: virtv1.VirtualMachineInstanceStatus{Phase: virtv1.Running}}, "n", n, now, 40*time.Second)
	if v.State != Suspect || v.RecheckAfter != 25*time.Second {
		t.Fatalf("got %s after %s", v.State, v.RecheckAfter)
	}
}

func TestNodeAvailable(t *testing.T) {
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue}
	never := func(*corev1.Taint) bool { return false }
	always := func(*corev1.Taint) bool { return true }
	cases := []struct {
		name      string
		node      corev1.Node
		tolerates func(*corev1.Taint) bool
		want      string
	}{
		{"ready", corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready}}}, never, ""},
		{"no Ready condition", corev1.Node{}, never, "node not Ready"},
		{"cordoned", corev1.Node{Spec: corev1.NodeSpec{Unschedulable: true}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready}}}, never, "node cordoned"},
		{"tainted", corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "gpu", Effect: corev1.TaintEffectNoSchedule}}}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready}}}, never, "untolerated taint gpu"},
		{"tolerated", corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "gpu", Effect: corev1.TaintEffectNoSchedule}}}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready}}}, always, ""},
		{"prefer-no-schedule is no bar", corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "x", Effect: corev1.TaintEffectPreferNoSchedule}}}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready}}}, never, ""},
	}
	for _, c := range cases {
		if got := NodeAvailable(&c.node, c.tolerates); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

func TestFromReplication(t *testing.T) {
	side := func(vmi, state string) *ftv1.SideStatus {
		return &ftv1.SideStatus{VMI: vmi, Node: "n", State: ftv1.SideState(state), Epoch: 3}
	}
	secondaryCreated := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	aloneSince := func(vmi string, at time.Time) *ftv1.SideStatus {
		s := side(vmi, "Alone")
		s.Since = &metav1.Time{Time: at}
		return s
	}
	cases := []struct {
		name                 string
		rep                  *ftv1.ReplicationStatus
		primaryLost, secLost string // the expected reasons, "" for no verdict
	}{
		{"no report", nil, "", ""},
		{"protected pair", &ftv1.ReplicationStatus{Primary: side("vm-1", "Protected"), Secondary: side("vm-2", "Replicating")}, "", ""},
		{"the secondary went live", &ftv1.ReplicationStatus{Primary: side("vm-2", "Alone")}, ReasonSecondaryWentLive, ""},
		{"the secondary went live and was protected again", &ftv1.ReplicationStatus{Primary: side("vm-2", "Protected")}, ReasonSecondaryWentLive, ""},
		{"the secondary is claiming: not yet", &ftv1.ReplicationStatus{Primary: side("vm-1", "Claiming"), Secondary: side("vm-2", "Claiming")}, "", ""},
		{"the primary was fenced", &ftv1.ReplicationStatus{Primary: side("vm-1", "Fenced")}, ReasonFenced, ""},
		{"the secondary was fenced", &ftv1.ReplicationStatus{Primary: side("vm-1", "Alone"), Secondary: side("vm-2", "Fenced")}, "", ReasonFenced},
		{"a report of an earlier member", &ftv1.ReplicationStatus{Primary: side("vm-0", "Fenced"), Secondary: side("vm-0", "Alone")}, "", ""},
		{"the primary went alone after the secondary was created", &ftv1.ReplicationStatus{Primary: aloneSince("vm-1", secondaryCreated.Add(20*time.Second)), Secondary: side("vm-2", "Replicating")}, "", ReasonPrimaryWentAlone},
		{"the primary alone since before the secondary: waiting for it to join", &ftv1.ReplicationStatus{Primary: aloneSince("vm-1", secondaryCreated.Add(-time.Minute))}, "", ""},
		{"the primary alone in the second the secondary was created: not decided", &ftv1.ReplicationStatus{Primary: aloneSince("vm-1", secondaryCreated)}, "", ""},
		{"an earlier primary alone after the secondary was created", &ftv1.ReplicationStatus{Primary: aloneSince("vm-0", secondaryCreated.Add(time.Minute))}, "", ""},
	}
	for _, c := range cases {
		p, s := FromReplication(c.rep, "vm-1", "vm-2", secondaryCreated)
		reason := func(v *Verdict) string {
			if v == nil {
				return ""
			}
			if v.State != Lost {
				t.Errorf("%s: a verdict that is not Lost: %+v", c.name, v)
			}
			return v.Reason
		}
		if reason(p) != c.primaryLost || reason(s) != c.secLost {
			t.Errorf("%s: primary %+v, secondary %+v; want reasons %q, %q", c.name, p, s, c.primaryLost, c.secLost)
		}
	}
}

func TestVouch(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	grace := 10 * time.Second
	downSince := now.Add(-30 * time.Second)
	lost := Verdict{State: Lost, Reason: ReasonNodeUnreachable, Since: downSince, Message: "node n1 is NodeUnreachable"}
	suspect := Verdict{State: Suspect, Reason: ReasonNodeNotReady, Since: now.Add(-3 * time.Second), Message: "node n1 is NodeNotReady"}
	report := func(state ftv1.SideState, ago time.Duration) *ftv1.SideStatus {
		return &ftv1.SideStatus{VMI: "vm-1", Node: "n1", State: state, Synchronized: true, Connected: true, ReportTime: metav1.NewTime(now.Add(-ago))}
	}
	for _, tc := range []struct {
		name    string
		v       Verdict
		side    *ftv1.SideStatus
		vouched bool
	}{
		{"a fresh Protected report after the node went down", lost, report(ftv1.SideProtected, 2*time.Second), true},
		{"a suspect node, reported since", suspect, report(ftv1.SideProtected, time.Second), true},
		{"a synchronized, connected secondary", lost, report(ftv1.SideReplicating, time.Second), true},
		{"a primary alone", lost, report(ftv1.SideAlone, time.Second), true},
		{"no report", lost, nil, false},
		{"a report of another VMI", lost, &ftv1.SideStatus{VMI: "vm-2", State: ftv1.SideProtected, ReportTime: metav1.NewTime(now)}, false},
		{"a report from before the node went down", lost, report(ftv1.SideProtected, 40*time.Second), false},
		{"reports stopped for the grace", lost, &ftv1.SideStatus{VMI: "vm-1", State: ftv1.SideProtected, ReportTime: metav1.NewTime(now.Add(-grace))}, false},
		// Its VM runs while it claims; it reports Alone or Fenced within the claim timeout.
		{"a side claiming the Lease", lost, report(ftv1.SideClaiming, time.Second), true},
		{"a fenced side", lost, report(ftv1.SideFenced, time.Second), false},
		{"an unsynchronized secondary", lost, &ftv1.SideStatus{VMI: "vm-1", State: ftv1.SideReplicating, Connected: true, ReportTime: metav1.NewTime(now)}, false},
		{"a deleted node", Verdict{State: Lost, Reason: ReasonNodeDeleted}, report(ftv1.SideProtected, time.Second), false},
		{"an ended VMI", Verdict{State: Lost, Reason: ReasonVMIEnded}, report(ftv1.SideProtected, time.Second), false},
		{"a running member", Verdict{State: Running, Reason: "Running"}, report(ftv1.SideProtected, time.Second), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seen time.Time
			if tc.side != nil {
				seen = tc.side.ReportTime.Time // the operator saw each report as it was written
			}
			got := Vouch(tc.v, tc.side, "vm-1", seen, now, grace)
			if vouched := got.Reason == ReasonNodeSilentReplicating; vouched != tc.vouched {
				t.Fatalf("vouched %v, want %v: %+v", vouched, tc.vouched, got)
			}
			if tc.vouched && (got.State != Running || got.RecheckAfter <= 0 || got.RecheckAfter > grace) {
				t.Fatalf("a vouched member runs, and is judged again when the report runs out: %+v", got)
			}
			if !tc.vouched && got != tc.v {
				t.Fatalf("the verdict changed: %+v", got)
			}
		})
	}
}

// TestTheVerdictSaysWhyKubeVirtCouldNotStartIt: a member whose domain KubeVirt could not start
// (virt-handler's Synchronized condition, with libvirt's and QEMU's words) or whose launcher
// ended saying why (Ready) carries that in its verdict's message, which the status shows: a
// secondary's copy smaller than the disk it must hold is named with both sizes.
func TestTheVerdictSaysWhyKubeVirtCouldNotStartIt(t *testing.T) {
	const qemu = "qemu-system-x86_64: -drive if=none,id=parent1,...: The sum of offset (0) and size (2147483648) has to be smaller or equal to the actual size of the containing file (2146435072)"
	node := &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	scheduled := &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm-2"}, Status: virtv1.VirtualMachineInstanceStatus{Phase: virtv1.Scheduled,
		Conditions: []virtv1.VirtualMachineInstanceCondition{{Type: virtv1.VirtualMachineInstanceSynchronized, Status: corev1.ConditionFalse, Reason: "Synchronizing", Message: "server error. command SyncVMI failed: " + qemu}}}}
	v := Judge(scheduled, "n1", node, time.Now(), time.Minute)
	if v.State != Pending || !strings.Contains(v.Message, "(2146435072)") || !strings.Contains(v.Message, "size (2147483648)") {
		t.Errorf("a secondary KubeVirt could not start: %+v", v)
	}
	ended := &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm-2"}, Status: virtv1.VirtualMachineInstanceStatus{Phase: virtv1.Failed,
		Conditions: []virtv1.VirtualMachineInstanceCondition{{Type: virtv1.VirtualMachineInstanceReady, Status: corev1.ConditionFalse, Reason: "DomainExited", Message: qemu}}}}
	if v := Judge(ended, "n1", node, time.Now(), time.Minute); v.State != Lost || !strings.Contains(v.Message, "ended in phase Failed: "+qemu+" (DomainExited)") {
		t.Errorf("a launcher that ended: %+v", v)
	}
	quiet := &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm-2"}, Status: virtv1.VirtualMachineInstanceStatus{Phase: virtv1.Scheduled}}
	if v := Judge(quiet, "n1", node, time.Now(), time.Minute); v.Message != "VMI vm-2 is Scheduled on node n1" {
		t.Errorf("a VMI KubeVirt says nothing of: %q", v.Message)
	}
}
