package controllers

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/health"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/roles"
)

// phaseDecide decides which member runs the VM (internal/roles) and carries the decision out in
// an order that a crash at any point leaves safe: the record first; then every member that leaves
// the primary role is labelled fenced (and deleted) before another is labelled primary, so that
// two members are never labelled primary at once; then the secondaries that cannot follow go.
// What is left undone is redone from the record by the next reconcile, whoever runs it.
func (r *FaultTolerantVMReconciler) phaseDecide(ctx context.Context, s *scope) error {
	if !s.record.Exists {
		s.record.Promotions = s.ftvm.Status.FailoverCount // a pair of a version before the record
	}
	plan := roles.Decide(s.record.Record, s.roleMembers())
	if acts(plan) {
		// A role changes: decide from the API server's record, not the cache's, and only once a
		// holder that the cache does not show is known to be gone.
		fresh, err := r.freshRecord(ctx, s.ftvm)
		if err != nil {
			return err
		}
		if s.record.Exists && fresh.Exists && s.record.movedTo(fresh) {
			// The record moved after this reconcile's view was taken (lockstepd's claim, or a
			// write of ours the cache does not show yet): the members were judged without it.
			// Judge them again from a view that includes it, rather than override the claim.
			s.requeueWithin(200 * time.Millisecond)
			return errStop
		}
		if _, counted := fresh.lease.GetAnnotations()[ftv1.AnnotationPromotions]; !counted {
			fresh.Promotions = s.ftvm.Status.FailoverCount // no record, or one lockstepd made
		}
		if fresh.Holder != "" && s.member(fresh.Holder) == nil {
			gone, err := r.memberGone(ctx, s.ftvm.Namespace, fresh.Holder)
			if err != nil {
				return err
			}
			if !gone {
				s.requeueWithin(time.Second) // the cache trails the holder's creation
				return errStop
			}
		}
		if fresh.lease != nil && !metav1.IsControlledBy(fresh.lease, s.ftvm) {
			// A record that lockstepd made (an operator before this one made none): adopt it, as
			// it is, so that the cache and the garbage collector know it.
			if err := r.writeRecord(ctx, s.ftvm, fresh, fresh.Record, fresh.holderNode); err != nil {
				return r.retryOnRace(s, err)
			}
		}
		s.record = fresh
		plan = roles.Decide(fresh.Record, s.roleMembers())
		if w := r.termLeft(s, fresh, plan); w != nil {
			s.waitForTerm(w)
			return errStop
		}
	}
	return r.carryOut(ctx, s, plan)
}

// acts says whether a plan changes anything.
func acts(p roles.Plan) bool {
	return p.Record != nil || p.Relabel != "" || len(p.Fence) > 0 || len(p.Drop) > 0
}

// memberGone says whether the member VMI is gone or going, as the API server says.
func (r *FaultTolerantVMReconciler) memberGone(ctx context.Context, namespace, name string) (bool, error) {
	vmi := &virtv1.VirtualMachineInstance{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, vmi)
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	return err == nil && vmi.DeletionTimestamp != nil, err
}

// carryOut carries out a plan.
func (r *FaultTolerantVMReconciler) carryOut(ctx context.Context, s *scope, plan roles.Plan) error {
	s.waiting, s.restart = plan.Waiting, plan.Restart
	// The nodes of the members let go as lost are suspect from now on, recorded first: with the
	// plan's record, or alone.
	added, err := r.suspectNodesOf(ctx, s, plan)
	if err != nil {
		return err
	}
	if added && plan.Record == nil {
		if err := r.writeRecord(ctx, s.ftvm, s.record, s.record.Record, s.record.holderNode); err != nil {
			return r.retryOnRace(s, err)
		}
	}
	if plan.Record != nil {
		before := *s.record
		holderNode := ""
		if h := s.member(plan.Record.Holder); h != nil {
			holderNode = h.node
		}
		if err := r.writeRecord(ctx, s.ftvm, s.record, *plan.Record, holderNode); err != nil {
			return r.retryOnRace(s, err)
		}
		r.announceRecord(ctx, s, before, plan)
	}
	if plan.Relabel != "" {
		// The promoted member's disks hold the VM from now on; they are marked before it is
		// labelled primary, so that a labelled primary always has its disks marked.
		if err := r.markPrimaryDisks(ctx, s.member(plan.Relabel).vmi); err != nil {
			return err
		}
	}
	for _, f := range plan.Fence {
		reason := ftv1.ReasonPrimaryLost
		if f.Duplicate {
			reason = ftv1.ReasonDuplicatePrimary
		}
		if err := r.retire(ctx, s, s.member(f.Name), reason, f.Why); err != nil {
			return r.retryOnRace(s, err)
		}
	}
	if plan.Relabel != "" {
		if err := r.relabelPrimary(ctx, s, s.member(plan.Relabel)); err != nil {
			return r.retryOnRace(s, err)
		}
		s.promoted = true
	}
	for _, d := range plan.Drop {
		mv := s.member(d.Name)
		if mv.verdict.State == health.Lost {
			r.Recorder.Eventf(s.ftvm, mv.vmi, corev1.EventTypeWarning, ftv1.ReasonSecondaryLost, "Replace",
				"secondary %s on node %s lost (%s): starting a new secondary", mv.vmi.Name, mv.node, mv.verdict.Message)
		}
		if err := r.retire(ctx, s, mv, ftv1.ReasonSecondaryLost, d.Why); err != nil {
			return r.retryOnRace(s, err)
		}
		s.dropped = append(s.dropped, mv)
	}
	s.primary, s.secondary = s.member(plan.Primary), s.member(plan.Secondary)
	return nil
}

// announceRecord records the events and metrics of a record just written.
func (r *FaultTolerantVMReconciler) announceRecord(ctx context.Context, s *scope, before record, plan roles.Plan) {
	log.FromContext(ctx).Info("wrote the pair's record", "holder", plan.Record.Holder, "epoch", plan.Record.Epoch,
		"promotions", plan.Record.Promotions, "was", before.Holder, "wasEpoch", before.Epoch)
	old := s.member(before.Holder)
	if old == nil || old.vmi.Name == plan.Promoted {
		old = nil
		for _, mv := range s.members {
			if mv.vmi.Labels[ftv1.LabelRole] == ftv1.RolePrimary && mv.vmi.Name != plan.Promoted {
				old = mv
			}
		}
	}
	lost := func() string {
		if old == nil {
			return fmt.Sprintf("primary %s is gone", orNone(before.Holder))
		}
		return fmt.Sprintf("primary %s on node %s lost (%s)", old.vmi.Name, old.node, old.verdict.Message)
	}
	switch {
	case plan.Promoted != "" && plan.Record.Holder == plan.Promoted:
		p := s.member(plan.Promoted)
		by := "promoted"
		if before.Holder == plan.Promoted {
			by = fmt.Sprintf("took over at epoch %d (lockstepd won the pair's Lease)", plan.Record.Epoch)
		}
		r.Recorder.Eventf(s.ftvm, p.vmi, corev1.EventTypeWarning, ftv1.ReasonPromoted, "Failover",
			"%s: secondary %s on node %s %s", lost(), p.vmi.Name, p.node, by)
		metrics.Failovers.WithLabelValues(s.ftvm.Namespace, s.ftvm.Name).Inc()
	case plan.Restart && before.Holder != "":
		why := "no secondary"
		for _, d := range plan.Drop {
			mv := s.member(d.Name)
			switch {
			case mv != nil && !mv.synced():
				why = fmt.Sprintf("secondary %s never synchronized", d.Name)
			case mv != nil && s.reportedUnsynced(mv):
				why = fmt.Sprintf("lockstepd reports secondary %s unsynchronized", d.Name)
			default:
				why = fmt.Sprintf("secondary %s cannot take over", d.Name)
			}
		}
		var regarding runtime.Object // an interface: never a typed nil
		if old != nil {
			regarding = old.vmi
		}
		r.Recorder.Eventf(s.ftvm, regarding, corev1.EventTypeWarning, ftv1.ReasonPrimaryLost, "Restart",
			"%s with %s: the VM restarts from the primary's disks", lost(), why)
		if plan.Promoted != "" {
			metrics.Failovers.WithLabelValues(s.ftvm.Namespace, s.ftvm.Name).Inc()
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// retryOnRace turns a write that lost a race (a Conflict, or AlreadyExists of the record) into a
// short requeue: the decision is taken again from a newer view.
func (r *FaultTolerantVMReconciler) retryOnRace(s *scope, err error) error {
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		log.Log.V(1).Info("lost a race; deciding again", "ftvm", s.ftvm.Name, "err", err.Error())
		s.requeueWithin(200 * time.Millisecond)
		return errStop
	}
	return err
}

// relabelPrimary labels the record's holder primary, with the epoch at which it became so.
func (r *FaultTolerantVMReconciler) relabelPrimary(ctx context.Context, s *scope, mv *memberView) error {
	return r.patchMember(ctx, mv, func(v *virtv1.VirtualMachineInstance) {
		v.Labels[ftv1.LabelRole] = ftv1.RolePrimary
		v.Annotations[ftv1.AnnotationRoleSince] = r.Clock.Now().UTC().Format(time.RFC3339)
		v.Annotations[ftv1.AnnotationEpoch] = fmt.Sprint(s.record.Epoch)
	})
}

// retire takes a member out of the pair: a member labelled primary is first labelled fenced (so
// that it never stands beside another primary, and lockstepd stops it), then it is deleted.
func (r *FaultTolerantVMReconciler) retire(ctx context.Context, s *scope, mv *memberView, reason, why string) error {
	if role := mv.vmi.Labels[ftv1.LabelRole]; role == ftv1.RolePrimary {
		if err := r.patchMember(ctx, mv, func(v *virtv1.VirtualMachineInstance) {
			v.Labels[ftv1.LabelRole] = ftv1.RoleFenced
			v.Annotations[ftv1.AnnotationFencedReason] = reason
			v.Annotations[ftv1.AnnotationFencedMessage] = why
		}); err != nil {
			return err
		}
		kind := corev1.EventTypeWarning
		if reason == ftv1.ReasonHalted {
			kind = corev1.EventTypeNormal // the user stopped the VM
		}
		r.Recorder.Eventf(s.ftvm, mv.vmi, kind, ftv1.ReasonMemberFenced, "Fence", "%s on node %s fenced: %s", mv.vmi.Name, mv.node, why)
	}
	return r.deleteMember(ctx, mv, why)
}

// patchMember changes a member VMI with an optimistic lock: a change made from a stale view fails
// with a Conflict rather than overwriting a newer one. A member already gone is fine.
func (r *FaultTolerantVMReconciler) patchMember(ctx context.Context, mv *memberView, change func(*virtv1.VirtualMachineInstance)) error {
	base := mv.vmi.DeepCopy()
	if mv.vmi.Labels == nil {
		mv.vmi.Labels = map[string]string{}
	}
	if mv.vmi.Annotations == nil {
		mv.vmi.Annotations = map[string]string{}
	}
	change(mv.vmi)
	if err := r.Patch(ctx, mv.vmi, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		*mv.vmi = *base
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("changing member %s: %w", mv.vmi.Name, err)
	}
	return nil
}

// deleteMember deletes a member VMI; a member already gone is fine.
func (r *FaultTolerantVMReconciler) deleteMember(ctx context.Context, mv *memberView, why string) error {
	if mv.vmi.DeletionTimestamp != nil {
		return nil
	}
	// Preconditions: delete exactly the member that was judged, not a newer one of the same name.
	err := r.Delete(ctx, mv.vmi, client.Preconditions{UID: &mv.vmi.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting member %s: %w", mv.vmi.Name, err)
	}
	log.FromContext(ctx).Info("deleted member", "vmi", mv.vmi.Name, "node", mv.node, "why", why)
	return nil
}
