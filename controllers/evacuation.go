package controllers

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/placement"
)

// Drains. Members run with evictionStrategy External: when a drain asks to evict a member's
// launcher pod, KubeVirt's virt-api refuses it (the drain retries) and marks the VMI,
// status.evacuationNodeName naming the node, for a controller such as this one to move it. The
// operator answers with the operation a person would ask for, so that a drain takes the paths
// that are already recorded, crash-tested and reported: a secondary there is replaced
// (MigrateSecondary, to any other node: a drained node is cordoned, and placement takes no
// cordoned node); a primary hands the VM over to its synchronized secondary (TestFailover: a
// switchover, nothing lost), and is stopped. Once the member's VMI is gone, KubeVirt deletes its
// pod and the drain goes on. The operation is made once per member (its name is the member's,
// and the operator never makes another), so an operator restarted between the mark and the
// operation makes the same one; it runs as any other, one at a time per pair, and its status says
// what it waits for (a pair that is not Protected is not moved: the drain waits). Nor is it made
// while no other node could take the pair's next secondary: moving the member would leave the VM
// unprotected, so the drain waits, and an event says why.

// +kubebuilder:rbac:groups=ft.lockstep.dev,resources=faulttolerantvmoperations,verbs=create

// evacuationName is the name of the operation that moves member vmi off a drained node.
func evacuationName(vmi string) string { return vmi + "-evacuation" }

// phaseEvacuations makes the operation that moves each member KubeVirt marked for evacuation.
func (r *FaultTolerantVMReconciler) phaseEvacuations(ctx context.Context, s *scope) error {
	for _, mv := range []*memberView{s.primary, s.secondary} {
		if mv == nil || mv.node == "" || mv.vmi.Status.EvacuationNodeName != mv.node {
			continue // a mark for another node is a migration target's, which members never have
		}
		typ, role := ftv1.OperationMigrateSecondary, ftv1.RoleSecondary
		if mv == s.primary {
			typ, role = ftv1.OperationTestFailover, ftv1.RolePrimary
		}
		if err := r.roomForNextSecondary(ctx, s, mv); err != nil {
			var none *placement.NoEligibleNodeError
			if !errors.As(err, &none) {
				return err
			}
			r.Recorder.Eventf(s.ftvm, mv.vmi, corev1.EventTypeWarning, ftv1.ReasonEvacuationWaiting, "Evacuate",
				"node %s is being drained, but no other node can take the VM's next secondary, so the %s %s stays and the drain waits: %v",
				mv.node, role, mv.vmi.Name, err)
			s.requeueWithin(r.Config.RetryInterval)
			continue
		}
		op := &ftv1.FaultTolerantVMOperation{
			ObjectMeta: metav1.ObjectMeta{Namespace: s.ftvm.Namespace, Name: evacuationName(mv.vmi.Name),
				Labels: map[string]string{ftv1.LabelPair: s.ftvm.Name, ftv1.LabelEvacuation: mv.node, ftv1.LabelManagedBy: ftv1.ManagedByValue}},
			Spec: ftv1.FaultTolerantVMOperationSpec{FaultTolerantVMName: s.ftvm.Name, Type: typ},
		}
		err := r.Create(ctx, op)
		if apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("creating operation %s for the drain of node %s: %w", op.Name, mv.node, err)
		}
		r.Recorder.Eventf(s.ftvm, op, corev1.EventTypeNormal, ftv1.ReasonEvacuating, "Evacuate",
			"node %s is being drained: operation %s (%s) moves the %s %s off it", mv.node, op.Name, typ, role, mv.vmi.Name)
		s.requeueWithin(r.Config.RetryInterval) // the operation runs once the cache has it
	}
	return nil
}

// roomForNextSecondary says whether a node could take the secondary that follows moving mv: one
// that is not the drained node (cordoned, so placement takes it anyway) nor the node of the member
// that will then be the primary.
func (r *FaultTolerantVMReconciler) roomForNextSecondary(ctx context.Context, s *scope, mv *memberView) error {
	primary := s.primary
	if mv == s.primary {
		if s.secondary == nil {
			return nil // the operation waits for a secondary anyway, and says so
		}
		primary = s.secondary
	}
	tmpl := secondaryTemplate(ctx, s, primary)
	nm := r.prepareMember(s, tmpl, ftv1.RoleSecondary, s.maxOrdinal+1, r.Placer.Sizing.Cluster(ctx))
	if err := r.awayFrom(ctx, s, primary, &nm.req); err != nil {
		return err
	}
	nm.req.AvoidNodes = append(nm.req.AvoidNodes, mv.node)
	return r.Placer.Fits(ctx, nm.req, &tmpl.Spec, s.ftvm.Spec.TopologyKey)
}
