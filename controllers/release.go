package controllers

import (
	"context"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/adoption"
	"github.com/lockstep-dev/lockstep/internal/member"
)

// releaseVM makes the VirtualMachine that a FaultTolerantVM with onDelete Release is handed back
// as, once its members are gone and its current disks kept (reconcileDelete): of its name, from
// its template with the firmware UUID and MAC addresses its members had, on its current disks. It
// says whether that VirtualMachine exists. The VirtualMachine carries the FaultTolerantVM's UID
// (adoption.AnnotationReleasedFrom), so that a reconcile after a crash finds it made and does not
// make it again; one that lockstep did not make blocks the release, with a warning.
func (r *FaultTolerantVMReconciler) releaseVM(ctx context.Context, ftvm *ftv1.FaultTolerantVM) (bool, error) {
	// The cache may still show a FaultTolerantVM whose release ended (its finalizer removed) and
	// whose VirtualMachine was deleted or changed since: only one the API server still holds is
	// released.
	fresh := &ftv1.FaultTolerantVM{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(ftvm), fresh); err != nil || fresh.UID != ftvm.UID || !controllerutil.ContainsFinalizer(fresh, ftv1.Finalizer) {
		return false, client.IgnoreNotFound(err)
	}
	if back, err := r.unadopt(ctx, ftvm); err != nil || back {
		return back, err
	}
	existing := &virtv1.VirtualMachine{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ftvm.Namespace, Name: ftvm.Name}, existing)
	switch {
	case err == nil && existing.Annotations[adoption.AnnotationReleasedFrom] == string(ftvm.UID):
		// Made on an earlier pass, whose event a crash right after may have lost (a repeat is
		// harmless).
		r.Recorder.Eventf(ftvm, nil, corev1.EventTypeNormal, ftv1.ReasonReleased, "Release",
			"released the VM into VirtualMachine %s (runStrategy %s)", existing.Name, ptr.Deref(existing.Spec.RunStrategy, ""))
		return true, nil
	case err == nil:
		r.Recorder.Eventf(ftvm, nil, corev1.EventTypeWarning, ftv1.ReasonReleaseBlocked, "Release",
			"onDelete is Release, but VirtualMachine %s exists and lockstep did not make it: its members are stopped and its disks kept, and the deletion waits. Remove or rename that VirtualMachine, or set onDelete to Stop.", ftvm.Name)
		return false, nil
	case !apierrors.IsNotFound(err):
		return false, err
	}
	claims, err := r.currentClaims(ctx, ftvm)
	if err != nil {
		return false, err
	}
	vm := adoption.VirtualMachine(ftvm, member.Normalize(ftvm.UID, ftvm.Spec.Template), claims)
	if err := r.Create(ctx, vm); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return false, nil // read again on the next pass
		}
		return false, fmt.Errorf("creating VirtualMachine %s to release the VM into: %w", vm.Name, err)
	}
	r.Recorder.Eventf(ftvm, nil, corev1.EventTypeNormal, ftv1.ReasonReleased, "Release",
		"released the VM into VirtualMachine %s (runStrategy %s) on its current disks: %s", vm.Name, *vm.Spec.RunStrategy, describeClaims(claims))
	return true, nil
}

// currentClaims maps each of the template's claim-backed volumes to the claim that holds its
// current disk: the one kept from this FaultTolerantVM (retainCurrentDisks), else the template's.
func (r *FaultTolerantVMReconciler) currentClaims(ctx context.Context, ftvm *ftv1.FaultTolerantVM) (map[string]string, error) {
	claims := pvcVolumes(&ftvm.Spec.Template.Spec)
	var retained corev1.PersistentVolumeClaimList
	if err := r.APIReader.List(ctx, &retained, client.InNamespace(ftvm.Namespace), client.MatchingLabels{ftv1.LabelRetainedFrom: ftvm.Name}); err != nil {
		return nil, err
	}
	for _, c := range retained.Items {
		volume := c.Labels[labelVolume]
		if _, ok := claims[volume]; ok && c.Annotations[ftv1.AnnotationRetainedFromUID] == string(ftvm.UID) {
			claims[volume] = c.Name
		}
	}
	return claims, nil
}

func describeClaims(claims map[string]string) string {
	if len(claims) == 0 {
		return "none"
	}
	volumes := make([]string, 0, len(claims))
	for v := range claims {
		volumes = append(volumes, v)
	}
	sort.Strings(volumes)
	out := ""
	for i, v := range volumes {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprintf("volume %s on claim %s", v, claims[v])
	}
	return out
}

// unadopt gives a VirtualMachine whose adoption had not finished (the operator halted it but had
// not removed it: annotationRunStrategyBeforeAdoption is on it) its run strategy back: it still
// holds the VM, on its own disks, so it is what the FaultTolerantVM is released into. It says
// whether there was one.
func (r *FaultTolerantVMReconciler) unadopt(ctx context.Context, ftvm *ftv1.FaultTolerantVM) (bool, error) {
	if ftvm.Spec.AdoptFrom == nil {
		return false, nil
	}
	vm := &virtv1.VirtualMachine{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ftvm.Namespace, Name: ftvm.Spec.AdoptFrom.VirtualMachineName}, vm)
	if apierrors.IsNotFound(err) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	before, halted := vm.Annotations[annotationRunStrategyBeforeAdoption]
	if !halted || vm.DeletionTimestamp != nil {
		return false, nil
	}
	base := vm.DeepCopy()
	strategy := virtv1.VirtualMachineRunStrategy(before)
	vm.Spec.RunStrategy = &strategy
	delete(vm.Annotations, annotationRunStrategyBeforeAdoption)
	if err := r.Patch(ctx, vm, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return false, fmt.Errorf("giving VirtualMachine %s its run strategy back: %w", vm.Name, err)
	}
	r.Recorder.Eventf(ftvm, nil, corev1.EventTypeNormal, ftv1.ReasonReleased, "Release",
		"the adoption of VirtualMachine %s had not finished: it runs the VM again as before (runStrategy %s)", vm.Name, before)
	return true, nil
}
