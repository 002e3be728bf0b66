// Package health judges whether a member of a pair is alive, from what Kubernetes shows of the
// member's VMI and its node. It is pure, so that every path is tested directly.
//
// The node lifecycle alone is slow: pods on a lost node are evicted only after five minutes. A
// member is lost as soon as any of these shows it:
//   - its node is deleted;
//   - its node has not been Ready, or has carried the unreachable/not-ready taint, for the grace
//     period;
//   - KubeVirt reports its pod terminating or gone (the VMI's Ready condition with reason
//     PodTerminating or PodNotExists);
//   - the VMI has ended (Succeeded or Failed) or is being deleted;
//   - lockstepd reports it fenced, or, for a primary, reports its secondary live
//     (FromReplication).
package health

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// State of a member.
type State int

const (
	// Pending: not running yet (being scheduled or booting).
	Pending State = iota
	// Running: the VMI runs on a Ready node.
	Running
	// Suspect: the node is not Ready, but for less than the grace period.
	Suspect
	// Lost: the member is gone or going; see Verdict.Reason.
	Lost
)

func (s State) String() string {
	return [...]string{"Pending", "Running", "Suspect", "Lost"}[s]
}

// Verdict is the judgement on one member.
type Verdict struct {
	State State
	// Reason is a short CamelCase reason (NodeDeleted, NodeNotReady, PodNotExists, ...).
	Reason string
	// Message says what was seen, for a person.
	Message string
	// RecheckAfter, for a Suspect member, is when it becomes Lost if nothing changes; for a
	// member that lockstepd vouches for, when its word runs out.
	RecheckAfter time.Duration
	// Since, for a verdict on the node, is when the node stopped being Ready.
	Since time.Time
}

// Reasons a member is lost or suspect.
const (
	ReasonNodeDeleted     = "NodeDeleted"
	ReasonNodeNotReady    = "NodeNotReady"
	ReasonNodeUnreachable = "NodeUnreachable"
	ReasonVMIDeleted      = "VMIDeleted"
	ReasonVMIEnded        = "VMIEnded"
	// ReasonNodeSilentReplicating: the member's node stopped reporting to the API server, but
	// lockstepd on it still reports the member replicating (Vouch).
	ReasonNodeSilentReplicating = "NodeSilentReplicating"
)

// Judge returns the verdict on a member whose VMI is vmi and whose node is node (nil when the
// node does not exist). nodeName is where placement put it.
func Judge(vmi *virtv1.VirtualMachineInstance, nodeName string, node *corev1.Node, now time.Time, grace time.Duration) Verdict {
	if vmi.DeletionTimestamp != nil {
		return Verdict{State: Lost, Reason: ReasonVMIDeleted, Message: fmt.Sprintf("VMI %s is being deleted", vmi.Name)}
	}
	if vmi.IsFinal() {
		return Verdict{State: Lost, Reason: ReasonVMIEnded, Message: fmt.Sprintf("VMI %s ended in phase %s%s", vmi.Name, vmi.Status.Phase, kubevirtSays(vmi))}
	}
	if node == nil {
		return Verdict{State: Lost, Reason: ReasonNodeDeleted, Message: fmt.Sprintf("node %s was deleted", nodeName)}
	}
	for _, c := range vmi.Status.Conditions {
		if c.Type == virtv1.VirtualMachineInstanceReady && c.Status != corev1.ConditionTrue &&
			(c.Reason == virtv1.PodTerminatingReason || c.Reason == virtv1.PodNotExistsReason) {
			return Verdict{State: Lost, Reason: c.Reason, Message: fmt.Sprintf("KubeVirt reports %s for VMI %s on node %s", c.Reason, vmi.Name, nodeName)}
		}
	}
	if v := judgeNode(node, now, grace); v.State != Running {
		return v
	}
	if vmi.Status.Phase == virtv1.Running {
		return Verdict{State: Running, Reason: string(virtv1.Running), Message: fmt.Sprintf("VMI %s runs on node %s", vmi.Name, nodeName)}
	}
	phase := vmi.Status.Phase
	if phase == "" {
		phase = virtv1.Pending
	}
	return Verdict{State: Pending, Reason: string(phase), Message: fmt.Sprintf("VMI %s is %s on node %s%s", vmi.Name, phase, nodeName, kubevirtSays(vmi))}
}

// kubevirtSays is why KubeVirt could not start the VMI, when it says so: virt-handler puts its
// failure to start the domain (libvirt's and QEMU's words, such as an image smaller than the
// size it is opened at) in the Synchronized condition, and a launcher that ended says why in
// Ready. "" when neither says anything.
func kubevirtSays(vmi *virtv1.VirtualMachineInstance) string {
	for _, typ := range []virtv1.VirtualMachineInstanceConditionType{virtv1.VirtualMachineInstanceSynchronized, virtv1.VirtualMachineInstanceReady} {
		for _, c := range vmi.Status.Conditions {
			if c.Type == typ && c.Status == corev1.ConditionFalse && c.Message != "" {
				return fmt.Sprintf(": %s (%s)", c.Message, c.Reason)
			}
		}
	}
	return ""
}

// NodeWell says whether a node exists and is Ready, with no sign of being down.
func NodeWell(node *corev1.Node, now time.Time, grace time.Duration) bool {
	return node != nil && judgeNode(node, now, grace).State == Running
}

// JudgeNode is the verdict on the node alone that a member on it gets (Judge): lost when the node
// is deleted (node nil) or has been down for grace.
func JudgeNode(nodeName string, node *corev1.Node, now time.Time, grace time.Duration) Verdict {
	if node == nil {
		return Verdict{State: Lost, Reason: ReasonNodeDeleted, Message: fmt.Sprintf("node %s was deleted", nodeName)}
	}
	return judgeNode(node, now, grace)
}

// judgeNode says whether a node is Ready, suspect (down for less than grace), or lost.
func judgeNode(node *corev1.Node, now time.Time, grace time.Duration) Verdict {
	var since time.Time
	reason := ""
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			since, reason = c.LastTransitionTime.Time, ReasonNodeNotReady
		}
	}
	for _, t := range node.Spec.Taints {
		if t.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		if t.Key == corev1.TaintNodeUnreachable || t.Key == corev1.TaintNodeNotReady {
			at := time.Time{}
			if t.TimeAdded != nil {
				at = t.TimeAdded.Time
			}
			if reason == "" || at.Before(since) {
				since = at
			}
			if t.Key == corev1.TaintNodeUnreachable {
				reason = ReasonNodeUnreachable
			} else if reason == "" {
				reason = ReasonNodeNotReady
			}
		}
	}
	if reason == "" {
		return Verdict{State: Running}
	}
	down := now.Sub(since)
	if down >= grace {
		return Verdict{State: Lost, Reason: reason, Since: since, Message: fmt.Sprintf("node %s is %s since %s (grace %s)", node.Name, reason, since.UTC().Format(time.RFC3339), grace)}
	}
	return Verdict{State: Suspect, Reason: reason, RecheckAfter: grace - down, Since: since,
		Message: fmt.Sprintf("node %s is %s since %s; lost after %s", node.Name, reason, since.UTC().Format(time.RFC3339), grace)}
}

// NodeAvailable says why no new member may be placed on node, or "" when one may. Tolerations
// are the member's; a node tainted NoSchedule or NoExecute without a toleration is unavailable.
func NodeAvailable(node *corev1.Node, tolerates func(*corev1.Taint) bool) string {
	ready := false
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			ready = true
		}
	}
	if !ready {
		return "node not Ready"
	}
	if node.Spec.Unschedulable {
		return "node cordoned"
	}
	for i := range node.Spec.Taints {
		t := &node.Spec.Taints[i]
		if t.Effect == corev1.TaintEffectPreferNoSchedule {
			continue
		}
		if !tolerates(t) {
			return "untolerated taint " + t.Key
		}
	}
	return ""
}

// Reasons lockstepd's reports give.
const (
	// ReasonSecondaryWentLive: the primary's secondary won the pair's Lease and runs the VM.
	ReasonSecondaryWentLive = "SecondaryWentLive"
	// ReasonFenced: the member's lockstepd fenced it (it lost the Lease, or could not reach it).
	ReasonFenced = "Fenced"
	// ReasonPrimaryWentAlone: the primary's lockstepd won the pair's Lease against a silent
	// secondary and runs the VM without it.
	ReasonPrimaryWentAlone = "PrimaryWentAlone"
)

// FromReplication judges the members from what lockstepd reported in status.replication, which
// is faster than the node lifecycle: lockstepd sees a silent peer in under a second. It returns
// a Lost verdict for the primary when the current secondary reports that it went live (it holds
// the pair's Lease, so the primary can no longer release anything), and for a member that its
// lockstepd reports Fenced, and for the secondary when the primary reports that it has run
// alone since after the secondary was created (secondaryCreated): it won the Lease against that
// secondary, which can never follow it again. Otherwise nil. A report names its VMI, so a report
// of an earlier member never condemns a later one.
func FromReplication(rep *ftv1.ReplicationStatus, primaryVMI, secondaryVMI string, secondaryCreated time.Time) (primary, secondary *Verdict) {
	if rep == nil {
		return nil, nil
	}
	if p := rep.Primary; p != nil && p.VMI == primaryVMI && p.State == ftv1.SideAlone && p.Since != nil &&
		secondaryVMI != "" && !secondaryCreated.IsZero() && p.Since.After(secondaryCreated) {
		secondary = &Verdict{State: Lost, Reason: ReasonPrimaryWentAlone, Message: fmt.Sprintf("lockstepd on node %s reports primary %s alone at Lease epoch %d since %s, after secondary %s was created: it won the Lease against its silent secondary",
			p.Node, p.VMI, p.Epoch, p.Since.UTC().Format(time.RFC3339), secondaryVMI)}
	}
	for _, side := range []*ftv1.SideStatus{rep.Primary, rep.Secondary} {
		if side == nil {
			continue
		}
		live := side.State == ftv1.SideAlone || side.State == ftv1.SideProtected
		switch {
		case side.State == ftv1.SideFenced && side.VMI == primaryVMI && primaryVMI != "":
			primary = &Verdict{State: Lost, Reason: ReasonFenced, Message: fmt.Sprintf("lockstepd on node %s fenced primary %s: %s", side.Node, side.VMI, side.Message)}
		case side.State == ftv1.SideFenced && side.VMI == secondaryVMI && secondaryVMI != "":
			secondary = &Verdict{State: Lost, Reason: ReasonFenced, Message: fmt.Sprintf("lockstepd on node %s fenced secondary %s: %s", side.Node, side.VMI, side.Message)}
		case live && side.VMI == secondaryVMI && secondaryVMI != "" && primaryVMI != "" && primary == nil:
			primary = &Verdict{State: Lost, Reason: ReasonSecondaryWentLive, Message: fmt.Sprintf("lockstepd reports secondary %s on node %s live at Lease epoch %d", side.VMI, side.Node, side.Epoch)}
		}
	}
	return primary, secondary
}

// Vouch applies lockstepd's word to a member whose node stopped reporting to the API server.
// The node lifecycle sees only the kubelet: a node that lost its link to the API server, or whose
// kubelet stopped, looks the same as a dead one, while its VMs run on. The pair knows better: the
// member's own lockstepd reports through the API server, and its peer hears it on the logging
// network. So a member judged Suspect or Lost on its node's conditions alone runs on (Running,
// ReasonNodeSilentReplicating) while side — the report of the member's own lockstepd — names
// it, was first seen by the operator (reportSeen, on the operator's clock: the report's own time
// is the node's clock, which may be minutes off) no earlier than the second the node went down
// (the API keeps seconds) and within grace of now, and says it replicates: a primary Protected
// (or Alone, with no secondary to lose), a secondary Replicating, synchronized and connected, or
// either side Claiming the pair's Lease. When the reports stop for grace, the node's verdict
// stands; when the host really died, the peer's lockstepd reports it long before that
// (FromReplication).
func Vouch(v Verdict, side *ftv1.SideStatus, vmi string, reportSeen, now time.Time, grace time.Duration) Verdict {
	if v.State != Suspect && v.State != Lost || v.Reason != ReasonNodeNotReady && v.Reason != ReasonNodeUnreachable {
		return v
	}
	if side == nil || side.VMI != vmi || side.ReportTime.IsZero() {
		return v
	}
	// Claiming is healthy too: the side's VM runs while it claims the pair's Lease, and within the
	// claim timeout (a primary: its term) it reports Alone or Fenced. A primary whose node still carried a stale
	// unreachable taint was once judged lost in that second, and its secondary, which had just
	// lost the claim and fenced itself, was promoted over it: no copy of the VM was left running.
	healthy := side.State == ftv1.SideProtected || side.State == ftv1.SideAlone || side.State == ftv1.SideClaiming ||
		side.State == ftv1.SideReplicating && side.Synchronized && side.Connected
	at := reportSeen
	if !healthy || at.IsZero() || at.Before(v.Since.Truncate(time.Second)) || now.Sub(at) >= grace {
		return v
	}
	return Verdict{State: Running, Reason: ReasonNodeSilentReplicating, Since: v.Since, RecheckAfter: grace - now.Sub(at),
		Message: fmt.Sprintf("%s; lockstepd there reported %s %s at %s: the VM runs on, and fails over only on lockstepd's word or when its reports stop for %s",
			v.Message, vmi, side.State, at.UTC().Format(time.RFC3339), grace)}
}
