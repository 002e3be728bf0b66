package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	virtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/metrics"
)

// reconcileDelete removes everything the operator made for a FaultTolerantVM, in any state and
// with any of its nodes dead, and then releases the finalizer: the members (a primary is fenced
// first), and once they are gone the disk copies (but those holding the VM's current disks,
// unless diskRetention is Delete), the pair's record and a logging network it created that no
// other FaultTolerantVM uses; with onDelete Release, a VirtualMachine then runs the VM on
// (release.go). Owner references let the garbage collector do the
// same; the finalizer does not rely on it (the logging network may be in another namespace), and
// every step reads the API server, so that nothing a cache does not show yet is left behind.
func (r *FaultTolerantVMReconciler) reconcileDelete(ctx context.Context, ftvm *ftv1.FaultTolerantVM) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(ftvm, ftv1.Finalizer) {
		return ctrl.Result{}, nil
	}
	s := &scope{ftvm: ftvm}
	// First the record: nobody may run the VM any more (finding: a secondary could win it and
	// go live on copies the deletion then removes).
	if _, err := r.releaseRecord(ctx, ftvm); err != nil {
		return ctrl.Result{}, fmt.Errorf("releasing the pair's record before its members go: %w", err)
	}
	var vmis virtv1.VirtualMachineInstanceList
	if err := r.APIReader.List(ctx, &vmis, client.InNamespace(ftvm.Namespace), client.MatchingLabels{ftv1.LabelPair: ftvm.Name}); err != nil {
		return ctrl.Result{}, err
	}
	remaining, requeue, err := r.endMembers(ctx, s, ftvm, vmis.Items)
	if err != nil {
		return ctrl.Result{}, err
	}
	if remaining > 0 {
		// VMI deletions wake us; the requeue covers a member whose node is lost.
		return ctrl.Result{RequeueAfter: requeue}, nil
	}

	kept, err := r.retainCurrentDisks(ctx, ftvm)
	if err != nil {
		return ctrl.Result{}, err
	}

	var pvcs corev1.PersistentVolumeClaimList
	if err := r.APIReader.List(ctx, &pvcs, client.InNamespace(ftvm.Namespace), client.MatchingLabels{ftv1.LabelPair: ftvm.Name, ftv1.LabelManagedBy: ftv1.ManagedByValue}); err != nil {
		return ctrl.Result{}, err
	}
	for i := range pvcs.Items {
		c := &pvcs.Items[i]
		if !metav1.IsControlledBy(c, ftvm) || c.DeletionTimestamp != nil {
			continue
		}
		if err := r.Delete(ctx, c, client.Preconditions{UID: &c.UID}); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, fmt.Errorf("deleting the disk copy %s: %w", c.Name, err)
		}
	}

	lease := &coordinationv1.Lease{}
	err = r.APIReader.Get(ctx, recordKey(ftvm), lease)
	switch {
	case err == nil && ownedOrUnclaimed(lease, ftvm) && lease.DeletionTimestamp == nil:
		if err := r.Delete(ctx, lease, client.Preconditions{UID: &lease.UID}); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, fmt.Errorf("deleting the pair's record: %w", err)
		}
	case client.IgnoreNotFound(err) != nil:
		return ctrl.Result{}, err
	}

	if ftvm.Spec.OnDelete == ftv1.OnDeleteRelease {
		// Last but the finalizer: the members are gone and the record with them, so that the
		// VirtualMachine is the one live copy of the VM.
		released, err := r.releaseVM(ctx, ftvm)
		if err != nil || !released {
			return ctrl.Result{RequeueAfter: r.Config.RetryInterval}, err
		}
	}

	if err := r.releaseLoggingNetwork(ctx, ftvm); err != nil {
		return ctrl.Result{}, err
	}

	if len(kept) > 0 {
		// Before the last write, so that a crash cannot lose it (a repeat is harmless).
		r.Recorder.Eventf(ftvm, nil, corev1.EventTypeNormal, ftv1.ReasonDisksRetained, "Delete",
			"kept the claims that hold the VM's current disks (diskRetention Retain): %s; the claims the template names hold an older state. Delete the kept claims when no longer needed.",
			strings.Join(kept, ", "))
	}
	base := ftvm.DeepCopy()
	controllerutil.RemoveFinalizer(ftvm, ftv1.Finalizer)
	if err := r.Patch(ctx, ftvm, client.MergeFrom(base)); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	metrics.Forget(ftvm.Namespace, ftvm.Name)
	return ctrl.Result{}, nil
}

// ownedOrUnclaimed says whether a Lease of the pair's name is this FaultTolerantVM's record: its
// controller is the FaultTolerantVM, or it has none (lockstepd made it before the operator did).
func ownedOrUnclaimed(l *coordinationv1.Lease, ftvm *ftv1.FaultTolerantVM) bool {
	owner := metav1.GetControllerOf(l)
	return owner == nil || owner.UID == ftvm.UID
}

// endMembers retires the FaultTolerantVM's members among vmis that are not going yet, and
// releases the launcher pods of those going on lost nodes (lostlaunchers.go). It returns how many
// members remain and when to look again.
func (r *FaultTolerantVMReconciler) endMembers(ctx context.Context, s *scope, ftvm *ftv1.FaultTolerantVM, vmis []virtv1.VirtualMachineInstance) (int, time.Duration, error) {
	remaining, requeue := 0, r.Config.RetryInterval
	var rec *record
	for i := range vmis {
		v := &vmis[i]
		if !metav1.IsControlledBy(v, ftvm) {
			continue
		}
		remaining++
		mv := &memberView{vmi: v, node: v.Labels[ftv1.LabelNode]}
		if v.DeletionTimestamp == nil {
			if err := r.retire(ctx, s, mv, ftv1.ReasonHalted, "the FaultTolerantVM is deleted"); err != nil {
				return 0, 0, err
			}
			continue
		}
		// A member on a lost node stays until its launcher pod goes.
		if rec == nil {
			fresh, err := r.freshRecord(ctx, ftvm)
			if err != nil {
				return 0, 0, err
			}
			rec = fresh
		}
		wait, err := r.releaseLostLauncher(ctx, ftvm, mv, rec)
		if err != nil {
			return 0, 0, err
		}
		if wait > 0 {
			requeue = min(requeue, wait)
		}
	}
	return remaining, requeue, nil
}
