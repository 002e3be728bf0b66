package controllers

import (
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/health"
	"github.com/lockstep-dev/lockstep/internal/member"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/placement"
)

// computeStatus is the one place that writes a FaultTolerantVM's status, from what the reconcile
// observed and did.
func (r *FaultTolerantVMReconciler) computeStatus(s *scope) {
	ftvm := s.ftvm
	st := &ftvm.Status
	st.ObservedGeneration = ftvm.Generation
	st.Primary = memberStatus(s.primary)
	st.Secondary = memberStatus(s.secondary)
	st.ReservedLogBandwidthMbps = int32(r.logBandwidthMbps(ftvm))
	if rec := s.record; rec != nil && rec.Exists {
		// The record counts the promotions; the status shows them.
		st.Epoch, st.FailoverCount = rec.Epoch, rec.Promotions
		if rec.lastPromotion != nil {
			st.LastFailoverTime = rec.lastPromotion
		}
	}
	halted := ftvm.Spec.RunStrategy == ftv1.RunStrategyHalted

	set := func(typ string, ok bool, reason, msg string) {
		status := metav1.ConditionFalse
		if ok {
			status = metav1.ConditionTrue
		}
		apimeta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: ftvm.Generation,
		})
	}

	if s.invalid != nil {
		set(ftv1.ConditionValid, false, ftv1.ReasonInvalidSpec, "the VM cannot be protected: "+s.invalid.Error())
	} else {
		set(ftv1.ConditionValid, true, ftv1.ReasonValid, "the VM can be protected")
	}

	pOK, pReason, pMsg := r.memberCondition(s, s.primary, s.primaryErr, "primary")
	sOK, sReason, sMsg := r.memberCondition(s, s.secondary, s.secondaryErr, "secondary")
	set(ftv1.ConditionPrimaryReady, pOK, pReason, pMsg)
	set(ftv1.ConditionSecondaryReady, sOK, sReason, sMsg)

	state, ok, reason, msg := protection(s, halted, pReason, pMsg, sReason, sMsg)
	st.State = state
	set(ftv1.ConditionProtected, ok, reason, msg)

	setFencedCondition(s, set)
	setRestartRequired(s, set)
}

// failingOver: a secondary was promoted in this reconcile and a new one is starting. A promotion
// that found no node for a new secondary is NotProtected with the placement's reason at once, not
// FailingOver until the next retry.
func (s *scope) failingOver() bool { return s.promoted && s.secondaryErr == nil }

// protectionOff is the Protected condition's reason and message while spec.protection keeps the
// pair without a secondary.
func protectionOff(s *scope) (string, string) {
	_, reason, msg := protectionOffCondition(s)
	if s.secondary != nil {
		msg += fmt.Sprintf("; secondary %s on node %s is stopping", s.secondary.vmi.Name, s.secondary.node)
	}
	return reason, "the VM runs unprotected: " + msg
}

func protectionOffCondition(s *scope) (bool, string, string) {
	if s.ftvm.Spec.Protection == ftv1.ProtectionSuspended {
		msg := "spec.protection is Suspended"
		if n := s.record.ReservedNode; n != "" {
			msg += fmt.Sprintf(" (node %s stays reserved for the secondary)", n)
		}
		return false, ftv1.ReasonProtectionSuspended, msg + "; set it to Enabled to protect the VM again"
	}
	return false, ftv1.ReasonProtectionDisabled, "spec.protection is Disabled; set it to Enabled to protect the VM again"
}

// setFencedCondition says whether a member is being fenced, and why.
func setFencedCondition(s *scope, set func(typ string, ok bool, reason, msg string)) {
	if fenced := s.fencedMembers(); len(fenced) > 0 {
		mv := fenced[0]
		reason := mv.vmi.Annotations[ftv1.AnnotationFencedReason]
		if reason == "" {
			reason = ftv1.ReasonMemberFenced
		}
		msg := fmt.Sprintf("%s on node %s is fenced and being deleted: %s", mv.vmi.Name, mv.node, mv.vmi.Annotations[ftv1.AnnotationFencedMessage])
		if len(fenced) > 1 {
			msg += fmt.Sprintf(" (and %d more)", len(fenced)-1)
		}
		set(ftv1.ConditionMemberFenced, true, reason, msg)
	} else {
		set(ftv1.ConditionMemberFenced, false, ftv1.ReasonNoneFenced, "no member is being fenced")
	}

}

// setRestartRequired says whether the members run an older template than the spec's.
func setRestartRequired(s *scope, set func(typ string, ok bool, reason, msg string)) {
	ftvm, st := s.ftvm, &s.ftvm.Status
	if s.primary != nil {
		want, err := templateHash(ftvm)
		if err == nil && want != s.primary.vmi.Annotations[ftv1.AnnotationTemplateHash] {
			set(ftv1.ConditionRestartRequired, true, ftv1.ReasonTemplateChanged,
				"the template changed after the members were created; set runStrategy to Halted and back to Running to apply it")
		} else {
			set(ftv1.ConditionRestartRequired, false, ftv1.ReasonTemplateCurrent, "the members run the current template")
		}
	} else {
		apimeta.RemoveStatusCondition(&st.Conditions, ftv1.ConditionRestartRequired)
	}
}

// fencedMembers are the members labelled fenced, not yet gone.
func (s *scope) fencedMembers() []*memberView {
	var out []*memberView
	for _, list := range [][]*memberView{s.members, s.gone} {
		for _, mv := range list {
			if mv.vmi.Labels[ftv1.LabelRole] == ftv1.RoleFenced {
				out = append(out, mv)
			}
		}
	}
	return out
}

// memberCondition says whether a member is ready, and why not.
func (r *FaultTolerantVMReconciler) memberCondition(s *scope, mv *memberView, startErr error, role string) (bool, string, string) {
	if s.ftvm.Spec.RunStrategy == ftv1.RunStrategyHalted {
		return false, ftv1.ReasonHalted, "runStrategy is Halted"
	}
	if mv == nil {
		switch {
		case role == "secondary" && s.unprotectedByChoice():
			return protectionOffCondition(s)
		case startErr != nil && errors.Is(startErr, placement.ErrNoEligibleNode):
			return false, ftv1.ReasonNoEligibleNode, fmt.Sprintf("no node can take the %s: %v", role, startErr)
		case errors.Is(startErr, errWaitingForCopies):
			return false, ftv1.ReasonWaitingForCopies, startErr.Error()
		case errors.Is(startErr, errDiskSizesUnknown):
			return false, ftv1.ReasonWaitingForDiskSizes, startErr.Error()
		case errors.Is(startErr, member.ErrDiskSizeUnsupported):
			return false, ftv1.ReasonDiskSizeUnsupported, startErr.Error()
		case startErr != nil:
			return false, ftv1.ReasonDiskNotFound, startErr.Error()
		case s.adopting != "":
			return false, ftv1.ReasonAdopting, "adopting: " + s.adopting
		case s.networkMissing != "":
			return false, ftv1.ReasonLoggingNetworkNotFound, s.networkMissing
		case s.invalid != nil && role == "primary":
			return false, ftv1.ReasonInvalidSpec, "the spec is invalid; see the Valid condition"
		case role == "secondary" && s.primary == nil:
			return false, ftv1.ReasonStarting, "waits for the primary"
		default:
			return false, ftv1.ReasonStarting, "being created"
		}
	}
	switch mv.verdict.State {
	case health.Running:
		if mv.verdict.Reason == health.ReasonNodeSilentReplicating {
			return true, ftv1.ReasonNodeSilentReplicating, mv.verdict.Message
		}
		return true, ftv1.ReasonRunning, mv.verdict.Message
	case health.Pending:
		return false, ftv1.ReasonStarting, mv.verdict.Message
	case health.Suspect:
		return false, mv.verdict.Reason, mv.verdict.Message
	default:
		return false, ftv1.ReasonNodeLost, mv.verdict.Message
	}
}

// memberStatus describes a member, keeping the time it took its role.
func memberStatus(mv *memberView) *ftv1.MemberStatus {
	if mv == nil {
		return nil
	}
	ms := &ftv1.MemberStatus{VMI: mv.vmi.Name, UID: string(mv.vmi.UID), Node: mv.node, Phase: mv.vmi.Status.Phase}
	if since, err := time.Parse(time.RFC3339, mv.vmi.Annotations[ftv1.AnnotationRoleSince]); err == nil {
		t := metav1.NewTime(since)
		ms.Since = &t
	}
	return ms
}

// templateHash is the hash of the FaultTolerantVM's current template, as members record it.
func templateHash(ftvm *ftv1.FaultTolerantVM) (string, error) {
	_, hash, err := member.EncodeTemplate(member.Normalize(ftvm.UID, ftvm.Spec.Template))
	return hash, err
}

// warningReasons are the condition reasons that need a person's attention.
var warningReasons = map[string]bool{
	ftv1.ReasonNoEligibleNode: true, ftv1.ReasonNodeLost: true, ftv1.ReasonLoggingNetworkNotFound: true,
	ftv1.ReasonInvalidSpec: true, ftv1.ReasonDiskNotFound: true, ftv1.ReasonSecondaryLost: true,
	ftv1.ReasonPrimaryLost: true, health.ReasonNodeNotReady: true, health.ReasonNodeUnreachable: true,
	ftv1.ReasonDuplicatePrimary: true, ftv1.ReasonWaitingForSecondary: true, ftv1.ReasonDiskSizeUnsupported: true,
	health.ReasonLockstepdNotRunning: true,
}

// quietReasons are first states that are not news. Any other state is, even when it is the first
// this reconcile sees: the cache may not show the status an earlier reconcile wrote.
var quietReasons = map[string]bool{
	ftv1.ReasonStarting: true, ftv1.ReasonSecondaryStarting: true, ftv1.ReasonValid: true, ftv1.ReasonTemplateCurrent: true,
	ftv1.ReasonNoneFenced: true, ftv1.ReasonWaitingForDiskSizes: true,
}

// emitTransitions records an event when the Protected, Valid or RestartRequired condition
// changes; actions (create, promote, replace) record their own.
func (r *FaultTolerantVMReconciler) emitTransitions(before, after *ftv1.FaultTolerantVM) {
	// MemberFenced is announced by the fencing itself (retire), with what was fenced and why.
	for _, typ := range []string{ftv1.ConditionProtected, ftv1.ConditionValid, ftv1.ConditionRestartRequired} {
		old := apimeta.FindStatusCondition(before.Status.Conditions, typ)
		cur := apimeta.FindStatusCondition(after.Status.Conditions, typ)
		if cur == nil || (old != nil && old.Status == cur.Status && old.Reason == cur.Reason) {
			continue
		}
		if old == nil && quietReasons[cur.Reason] {
			continue
		}
		if !r.announced.first(client.ObjectKeyFromObject(after), typ, string(cur.Status)+"/"+cur.Reason) {
			continue
		}
		if typ == ftv1.ConditionProtected {
			r.observeReprotection(client.ObjectKeyFromObject(after), old, cur)
		}
		kind := corev1.EventTypeNormal
		if warningReasons[cur.Reason] {
			kind = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(after, nil, kind, cur.Reason, typ, "%s", cur.Message)
	}
}

// observeReprotection times a re-protection: Protected again after it was lost, from the moment
// it was lost (the False condition's transition time). Only a VM that this operator process saw
// Protected before counts, so that a first start, or a start after a halt, is not one; a
// re-protection under way when the operator restarts is not counted.
func (r *FaultTolerantVMReconciler) observeReprotection(key types.NamespacedName, old, cur *metav1.Condition) {
	switch {
	case cur.Status == metav1.ConditionTrue:
		if _, was := r.protectedOnce.Swap(key, true); was && old != nil && old.Status == metav1.ConditionFalse {
			metrics.Reprotection.Observe(cur.LastTransitionTime.Sub(old.LastTransitionTime.Time).Seconds())
		}
	case cur.Reason == ftv1.ReasonHalted:
		r.protectedOnce.Delete(key)
	}
}

// announcements is the last announced state of each condition of each FaultTolerantVM.
type announcements struct {
	mu   sync.Mutex
	last map[types.NamespacedName]map[string]string
}

// first records that the condition is now in state, and says whether that is news.
func (a *announcements) first(key types.NamespacedName, condition, state string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.last == nil {
		a.last = map[types.NamespacedName]map[string]string{}
	}
	if a.last[key] == nil {
		a.last[key] = map[string]string{}
	}
	if a.last[key][condition] == state {
		return false
	}
	a.last[key][condition] = state
	return true
}

func (a *announcements) forget(key types.NamespacedName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.last, key)
}

// startsUnaided says that a primary with this reason starts without anyone acting: it is being
// created, or the VirtualMachine it adopts is stopping.
func startsUnaided(reason string) bool {
	return reason == ftv1.ReasonStarting || reason == ftv1.ReasonAdopting
}

// decisionWaits says whether the decision on a primary that cannot be seen waits.
func (s *scope) decisionWaits() bool { return s.termWait != nil || s.waiting }

// waitingFor is the pair's state and Protected condition while the decision on a primary that
// cannot be seen waits: for its record's term (Protected while its secondary renews for it), or
// for its suspect secondary.
func waitingFor(s *scope) (state ftv1.FTState, ok bool, reason, msg string) {
	switch {
	case s.termWait != nil && s.termWait.witnessed(s.secondary):
		return ftv1.StateProtected, true, ftv1.ReasonWitnessedBySecondary, s.termWait.witnessMessage()
	case s.termWait != nil:
		return ftv1.StateNotProtected, false, ftv1.ReasonWaitingForRecordTerm, s.termWait.message()
	}
	return ftv1.StateNotProtected, false, ftv1.ReasonWaitingForSecondary,
		fmt.Sprintf("the primary is lost; its synchronized secondary %s on node %s is not Ready (%s) and is promoted if it comes back within the grace; otherwise the VM restarts from its disks",
			s.secondary.vmi.Name, s.secondary.node, s.secondary.verdict.Message)
}

// protection is the pair's state and its Protected condition (ok, reason, message), from the
// members' verdicts and the reasons of their own conditions.
func protection(s *scope, halted bool, pReason, pMsg, sReason, sMsg string) (state ftv1.FTState, ok bool, reason, msg string) {
	switch {
	case halted:
		state, reason, msg = ftv1.StateStopped, ftv1.ReasonHalted, "runStrategy is Halted"
		if s.primary != nil || s.secondary != nil {
			msg += "; members are stopping"
		}
	case s.decisionWaits():
		state, ok, reason, msg = waitingFor(s)
	case s.failingOver():
		state = ftv1.StateFailingOver
		ok, reason, msg = false, ftv1.ReasonPromoted,
			fmt.Sprintf("the primary was lost and %s on node %s was promoted; a new secondary is starting", s.primary.vmi.Name, s.primary.node)
	case s.unprotectedByChoice() && s.primary.alive():
		state = ftv1.StateNotProtected
		reason, msg = protectionOff(s)
	case s.primary.alive() && s.secondary != nil && s.secondary.verdict.Reason == health.ReasonLockstepdNotRunning:
		state = ftv1.StateNotProtected // COLO replicates only through lockstepd
		ok, reason, msg = false, health.ReasonLockstepdNotRunning, "secondary: "+sMsg
	case s.primary.alive() && s.secondary.alive() && !s.holdsState(s.secondary):
		state = ftv1.StateStarting
		ok, reason, msg = false, ftv1.ReasonSecondaryStarting,
			fmt.Sprintf("secondary %s on node %s is synchronizing with the primary", s.secondary.vmi.Name, s.secondary.node)
	case s.primary.alive() && s.secondary.alive():
		state = ftv1.StateProtected
		ok, reason, msg = true, ftv1.ReasonProtected,
			fmt.Sprintf("primary on node %s, secondary on node %s", s.primary.node, s.secondary.node)
	case !s.primary.alive():
		// A primary that is being started is Starting; one that cannot start until a person or
		// the cluster acts (no eligible node, invalid spec, missing network or disk) is NotProtected.
		state = ftv1.StateStarting
		if s.primary == nil && !startsUnaided(pReason) {
			state = ftv1.StateNotProtected
		}
		ok, reason, msg = false, pReason, "primary: "+pMsg
	case s.secondary != nil && s.secondary.verdict.State == health.Pending:
		state = ftv1.StateStarting
		ok, reason, msg = false, ftv1.ReasonSecondaryStarting, "secondary: "+sMsg
	case s.secondary == nil && sReason == ftv1.ReasonWaitingForDiskSizes:
		state = ftv1.StateStarting // a new COLO pair's secondary follows its primary
		ok, reason, msg = false, sReason, "secondary: "+sMsg
	default:
		state = ftv1.StateNotProtected
		ok, reason, msg = false, sReason, "the VM runs without a secondary: "+sMsg
	}
	return state, ok, reason, msg
}
