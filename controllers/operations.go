package controllers

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/health"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/operations"
	"github.com/lockstep-dev/lockstep/internal/placement"
	"github.com/lockstep-dev/lockstep/internal/roles"
)

// FaultTolerantVMOperations (vSphere FT's test failover, test restart of the secondary and
// migration of the secondary) run in the FaultTolerantVM's reconcile, which alone changes the
// pair's members: one at a time per pair, oldest first. internal/operations decides each step;
// this file observes, carries the step out, and writes the operation's status, which it alone
// writes. What an operation acts on is in its status before it acts, and a test failover's role
// change is in the pair's record with the operation's UID, so that an operator restarted at any
// point carries on from there and never does an operation twice.

// +kubebuilder:rbac:groups=ft.lockstep.dev,resources=faulttolerantvmoperations,verbs=get;list;watch
// +kubebuilder:rbac:groups=ft.lockstep.dev,resources=faulttolerantvmoperations/status,verbs=get;update;patch

// openOperations lists the operations on the FaultTolerantVM key names that have not ended.
func (r *FaultTolerantVMReconciler) openOperations(ctx context.Context, key types.NamespacedName) ([]*ftv1.FaultTolerantVMOperation, error) {
	var list ftv1.FaultTolerantVMOperationList
	if err := r.List(ctx, &list, client.InNamespace(key.Namespace), client.MatchingFields{indexOperationByFTVM: key.Name}); err != nil {
		return nil, err
	}
	var open []*ftv1.FaultTolerantVMOperation
	for i := range list.Items {
		if op := &list.Items[i]; !op.Done() && op.DeletionTimestamp == nil {
			open = append(open, op)
		}
	}
	return open, nil
}

// loadOperations finds the pair's operation that runs or is next, and the ones queued after it.
func (r *FaultTolerantVMReconciler) loadOperations(ctx context.Context, s *scope) error {
	open, err := r.openOperations(ctx, client.ObjectKeyFromObject(s.ftvm))
	if err != nil {
		return err
	}
	// A running one first (an operator restarted midway), then the oldest.
	sort.SliceStable(open, func(i, j int) bool {
		ri, rj := open[i].Status.Phase == ftv1.OperationRunning, open[j].Status.Phase == ftv1.OperationRunning
		if ri != rj {
			return ri
		}
		if !open[i].CreationTimestamp.Equal(&open[j].CreationTimestamp) {
			return open[i].CreationTimestamp.Before(&open[j].CreationTimestamp)
		}
		return open[i].Name < open[j].Name
	})
	if len(open) > 0 {
		s.operation, s.queued = open[0], open[1:]
	}
	return nil
}

// operationPlacement is where the pair's next secondary may go while its operation runs.
func (s *scope) operationPlacement() (node, avoid string) {
	if s.operation == nil {
		return "", ""
	}
	return operations.Placement(s.opView())
}

// opView is the operation as internal/operations sees it.
func (s *scope) opView() operations.Op {
	op := s.operation
	v := operations.Op{Type: operations.Type(op.Spec.Type), Node: op.Spec.Node,
		Started: op.Status.Phase == ftv1.OperationRunning, Recorded: s.record.Operation == string(op.UID)}
	if p := op.Status.Primary; p != nil {
		v.Primary = p.VMI
	}
	if sec := op.Status.Secondary; sec != nil {
		v.Secondary, v.SecondaryNode, v.SecondaryUID = sec.VMI, sec.Node, sec.UID
	}
	return v
}

// pairView is the pair as internal/operations sees it. Protected is the status's word, and only
// while the status names the members this reconcile sees.
func (s *scope) pairView() operations.Pair {
	ftvm := s.ftvm
	p := operations.Pair{Holder: s.record.Holder, State: string(ftvm.Status.State)}
	switch {
	case ftvm.Spec.RunStrategy == ftv1.RunStrategyHalted:
		p.State = "Halted"
	case s.protectionOff:
		p.State = "running with protection " + string(ftvm.Spec.Protection)
	default:
		p.Active = true
	}
	view := func(mv *memberView) *operations.Member {
		if mv == nil {
			return nil
		}
		return &operations.Member{Name: mv.vmi.Name, Node: mv.node, UID: string(mv.vmi.UID), Synced: s.holdsState(mv),
			Running: mv.verdict.State == health.Running}
	}
	p.Primary, p.Secondary = view(s.primary), view(s.secondary)
	st := ftvm.Status
	p.Protected = st.State == ftv1.StateProtected && p.Primary != nil && p.Secondary != nil &&
		st.Primary != nil && st.Primary.VMI == p.Primary.Name && st.Secondary != nil && st.Secondary.VMI == p.Secondary.Name
	return p
}

// migrationPlaced judges a migration that waits for its new secondary by why that secondary
// found no node: while the node asked for still holds a member of this pair on its way out (a
// secondary stopped moments ago, whose VMI is still being deleted), the migration waits for it;
// any other reason ends it, and the secondary then starts wherever it fits.
func migrationPlaced(step operations.Step, op *ftv1.FaultTolerantVMOperation, placeErr error) operations.Step {
	var none *placement.NoEligibleNodeError
	if placeErr == nil || !errors.As(placeErr, &none) {
		return step
	}
	if node := op.Spec.Node; node != "" && none.Rejected[node] == placement.RejectSamePair {
		return operations.Step{Action: operations.Wait, Message: fmt.Sprintf(
			"%s; node %s still holds a member of this pair that is being deleted", step.Message, node)}
	}
	return operations.Step{Action: operations.Fail, Message: fmt.Sprintf(
		"the secondary was stopped, but no node could take the new one (%v); a secondary now starts on any node that fits", placeErr)}
}

// phaseOperations takes the pair's current operation one step.
func (r *FaultTolerantVMReconciler) phaseOperations(ctx context.Context, s *scope) error {
	for _, q := range s.queued {
		if err := r.setOperation(ctx, q, func(st *ftv1.FaultTolerantVMOperationStatus) {
			st.Phase, st.Message = ftv1.OperationPending, fmt.Sprintf("waiting for operation %s", s.operation.Name)
		}); err != nil {
			return err
		}
	}
	op := s.operation
	if op == nil {
		return nil
	}
	step := operations.Next(s.opView(), s.pairView())
	if step.Action == operations.Wait && op.Spec.Type == ftv1.OperationMigrateSecondary {
		step = migrationPlaced(step, op, s.secondaryErr)
	}
	log.FromContext(ctx).V(1).Info("operation", "operation", op.Name, "type", op.Spec.Type, "step", step.Action.String(), "message", step.Message)
	switch step.Action {
	case operations.Wait:
		return r.setOperation(ctx, op, func(st *ftv1.FaultTolerantVMOperationStatus) {
			if st.Phase == "" {
				st.Phase = ftv1.OperationPending
			}
			st.Message = step.Message
		})
	case operations.Start:
		err := r.setOperation(ctx, op, func(st *ftv1.FaultTolerantVMOperationStatus) {
			now := metav1.NewTime(r.Clock.Now())
			st.Phase, st.Message, st.StartTime = ftv1.OperationRunning, step.Message, &now
			st.Primary, st.Secondary = memberStatus(s.primary), memberStatus(s.secondary)
		})
		if err == nil {
			r.Recorder.Eventf(s.ftvm, op, corev1.EventTypeNormal, string(op.Spec.Type), "Start", "operation %s: %s", op.Name, step.Message)
			s.requeueWithin(r.Config.RetryInterval) // the next step follows from the status just written
		}
		return err
	case operations.Promote:
		return r.testFailover(ctx, s, step.Message)
	case operations.Drop:
		mv := s.secondary
		why := fmt.Sprintf("operation %s (%s)", op.Name, op.Spec.Type)
		if err := r.retire(ctx, s, mv, string(op.Spec.Type), why); err != nil {
			return r.retryOnRace(s, err)
		}
		r.Recorder.Eventf(s.ftvm, mv.vmi, corev1.EventTypeNormal, string(op.Spec.Type), "StopSecondary",
			"operation %s: secondary %s on node %s stopped; a new secondary starts", op.Name, mv.vmi.Name, mv.node)
		s.secondary = nil
		s.requeueWithin(r.Config.RetryInterval)
		return r.setOperation(ctx, op, func(st *ftv1.FaultTolerantVMOperationStatus) { st.Message = step.Message })
	default: // Succeed, Fail
		phase, kind := ftv1.OperationSucceeded, corev1.EventTypeNormal
		if step.Action == operations.Fail {
			phase, kind = ftv1.OperationFailed, corev1.EventTypeWarning
		}
		err := r.setOperation(ctx, op, func(st *ftv1.FaultTolerantVMOperationStatus) {
			now := metav1.NewTime(r.Clock.Now())
			st.Phase, st.Message, st.CompletionTime = phase, step.Message, &now
			if phase == ftv1.OperationSucceeded {
				st.Result = &ftv1.OperationResult{Primary: memberStatus(s.primary), Secondary: memberStatus(s.secondary), Epoch: s.record.Epoch}
			}
		})
		if err == nil {
			r.Recorder.Eventf(s.ftvm, op, kind, string(op.Spec.Type)+string(phase), "Complete", "operation %s %s: %s", op.Name, phase, step.Message)
			if len(s.queued) > 0 {
				s.requeueWithin(r.Config.RetryInterval)
			}
		}
		return err
	}
}

// testFailover promotes the secondary over the running primary: the record names it, with the
// operation, by compare-and-set on the record as the API server has it; then the role change is
// carried out as for any promotion (the old primary fenced, the secondary labelled primary).
// lockstepd on the secondary claims at once (the record already names it); the old primary's
// outputs are held from the moment its secondary stops acknowledging, so none is lost or doubled.
func (r *FaultTolerantVMReconciler) testFailover(ctx context.Context, s *scope, msg string) error {
	op := s.operation
	fresh, err := r.freshRecord(ctx, s.ftvm)
	if err != nil {
		return err
	}
	if fresh.Operation == string(op.UID) || s.record.movedTo(fresh) {
		s.requeueWithin(200 * time.Millisecond) // the cache trails the record: decide again from it
		return errStop
	}
	sec := s.secondary
	next, _ := fresh.Promote(sec.vmi.Name)
	next.Operation = string(op.UID)
	if err := r.writeRecord(ctx, s.ftvm, fresh, next, sec.node); err != nil {
		return r.retryOnRace(s, err)
	}
	s.record = fresh
	log.FromContext(ctx).Info("wrote the pair's record", "holder", next.Holder, "epoch", next.Epoch, "operation", op.Name)
	r.Recorder.Eventf(s.ftvm, sec.vmi, corev1.EventTypeNormal, ftv1.ReasonPromoted, "TestFailover",
		"operation %s: %s at epoch %d", op.Name, msg, next.Epoch)
	metrics.Failovers.WithLabelValues(s.ftvm.Namespace, s.ftvm.Name).Inc()
	if err := r.carryOut(ctx, s, roles.Decide(s.record.Record, s.roleMembers())); err != nil {
		return err
	}
	return r.setOperation(ctx, op, func(st *ftv1.FaultTolerantVMOperationStatus) {
		st.Message = fmt.Sprintf("secondary %s took over at epoch %d; a new secondary starts", sec.vmi.Name, next.Epoch)
	})
}

// orphanedOperations says so on the operations of a FaultTolerantVM that does not exist: one that
// had not started waits for a FaultTolerantVM of that name (a GitOps tool may create the
// operation first); one that ran fails, since the pair it acted on is gone.
func (r *FaultTolerantVMReconciler) orphanedOperations(ctx context.Context, key types.NamespacedName) error {
	open, err := r.openOperations(ctx, key)
	if err != nil {
		return err
	}
	for _, op := range open {
		err := r.setOperation(ctx, op, func(st *ftv1.FaultTolerantVMOperationStatus) {
			if st.Phase == ftv1.OperationRunning {
				now := metav1.NewTime(r.Clock.Now())
				st.Phase, st.CompletionTime = ftv1.OperationFailed, &now
				st.Message = fmt.Sprintf("FaultTolerantVM %s was deleted while the operation ran", key.Name)
				return
			}
			st.Phase, st.Message = ftv1.OperationPending, fmt.Sprintf("waiting: FaultTolerantVM %s does not exist", key.Name)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// setOperation patches an operation's status when change changes it.
func (r *FaultTolerantVMReconciler) setOperation(ctx context.Context, op *ftv1.FaultTolerantVMOperation, change func(*ftv1.FaultTolerantVMOperationStatus)) error {
	base := op.DeepCopy()
	change(&op.Status)
	if apiequality.Semantic.DeepEqual(base.Status, op.Status) {
		return nil
	}
	if err := r.Status().Patch(ctx, op, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		*op = *base
		return client.IgnoreNotFound(fmt.Errorf("writing the status of operation %s: %w", op.Name, err))
	}
	return nil
}
