package controllers

import (
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/health"
	"github.com/lockstep-dev/lockstep/internal/roles"
	"github.com/lockstep-dev/lockstep/internal/term"
)

// The pair's record is a lease with a term (internal/term): the member that runs the VM renews
// it, and pauses its VM once it cannot. The operator never compares another node's clock with
// its own: it notes when it first saw each renewal, and takes the record from a holder it
// cannot see only once the term (with its margins) has passed on its own clock since then. A
// restarted operator has seen nothing yet, and waits a whole term: that only delays.

// recordRenewalSeen is when the operator first saw the renewal lease carries (now, if it is new):
// one of the Sightings, keyed by the record, its value the renewal's own fields as their writer
// wrote them (compared for equality, never as times).
func recordRenewalSeen(sightings *Sightings, lease *coordinationv1.Lease, now time.Time) time.Time {
	renewed := ""
	if lease.Spec.RenewTime != nil {
		renewed = lease.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
	}
	value := fmt.Sprintf("%s|%s|%d|%s|%s", lease.UID, ptr.Deref(lease.Spec.HolderIdentity, ""),
		ptr.Deref(lease.Spec.LeaseTransitions, 0), renewed, lease.Annotations[ftv1.AnnotationRenewedBy])
	return sightings.Seen(recordSighting(lease.Namespace, lease.Name), value, now)
}

// recordSighting is the Sightings key of a pair's record.
func recordSighting(namespace, lease string) string { return "record/" + namespace + "/" + lease }

// termWait is what the operator waits for before it may take the record from its holder.
type termWait struct {
	holder, node, why string
	// by is who wrote the last renewal: the holder, or its secondary renewing for it.
	by         string
	left, term time.Duration
}

// termLeft says how long the operator must still wait before plan, decided on rec, may take the
// record from its holder: zero when the plan keeps the holder, when the holder is known to have
// stopped (its lockstepd fenced it, its VMI ended, or its secondary went live), or when no
// lockstepd ever renewed the record with a term (a pair without lockstepd, or of a version
// before terms).
func (r *FaultTolerantVMReconciler) termLeft(s *scope, rec *record, plan roles.Plan) *termWait {
	if rec.lease == nil || rec.Holder == "" || plan.Record == nil || rec.lease.Spec.LeaseDurationSeconds == nil {
		return nil
	}
	if plan.Record.Holder == rec.Holder && plan.Record.Epoch == rec.Epoch {
		return nil
	}
	w := &termWait{holder: rec.Holder, node: rec.holderNode, why: "its VMI is being deleted", by: rec.lease.Annotations[ftv1.AnnotationRenewedBy]}
	if h := s.member(rec.Holder); h != nil {
		switch h.verdict.Reason {
		case health.ReasonFenced, health.ReasonVMIEnded, health.ReasonSecondaryWentLive:
			return nil // it reported its own end through the API server: nothing of it runs
		}
		w.node, w.why = h.node, h.verdict.Message
	}
	t := term.Of(rec.lease.Spec.LeaseDurationSeconds)
	seen := recordRenewalSeen(r.Sightings, rec.lease, r.Clock.Now())
	w.left, w.term = t.ExpiresIn(seen, r.Clock.Now()), time.Duration(t)
	if w.left == 0 {
		return nil
	}
	return w
}

// waitForTerm keeps the holder while its term runs: nothing is decided, the members keep their
// roles, and the pair is looked at again when the term has passed.
func (s *scope) waitForTerm(w *termWait) {
	s.termWait = w
	s.primary = s.member(w.holder)
	for _, mv := range s.members {
		if mv.vmi.Labels[ftv1.LabelRole] == ftv1.RoleSecondary && s.secondary == nil {
			s.secondary = mv
		}
	}
	s.requeueWithin(w.left)
}

// witnessed says whether the last renewal is the secondary's, made for its primary: a
// synchronized secondary renews only while it hears its primary, so the pair runs protected
// though the operator cannot see the primary.
func (w *termWait) witnessed(secondary *memberView) bool {
	return secondary.alive() && secondary.synced() && w.by != "" &&
		w.by == ftv1.SideIdentity(secondary.node, secondary.vmi.Name)
}

// witnessMessage is the Protected condition's message while the secondary renews for its primary.
func (w *termWait) witnessMessage() string {
	return fmt.Sprintf("primary %s on node %s cannot be seen (%s), but its secondary (%s) renews the pair's record for it, which it does only while it hears the primary: "+
		"the pair runs protected. If the renewals stop, the VM starts elsewhere, or the secondary is promoted, %s after the last one",
		w.holder, w.node, w.why, w.by, w.term)
}

// message is the Protected condition's message while the operator waits.
func (w *termWait) message() string {
	by := ""
	if w.by != "" {
		by = " by " + w.by
	}
	return fmt.Sprintf("primary %s on node %s cannot be seen (%s), but the pair's record was renewed%s less than its term (%s) ago: "+
		"it may still run, and pauses its VM once the record is not renewed; the VM starts elsewhere, or its secondary is promoted, in %s unless it is renewed again",
		w.holder, w.node, w.why, by, w.term, w.left.Round(time.Second))
}
