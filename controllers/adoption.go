package controllers

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/adoption"
)

// Adoption (spec.adoptFrom): the VirtualMachine that a FaultTolerantVM takes over must have
// stopped, and be gone, before either member starts, so that the VM never runs twice on its
// disks. The spec is the decision, written by the user before the operator acts; each step below
// is read back from the API server, so an operator that crashes between two of them carries on.
//
//  1. the VirtualMachine runs: its runStrategy is set to Halted (KubeVirt stops its VMI), the one
//     it had noted on it;
//  2. a VMI of its name that is no member still exists: wait (on a lost node, until KubeVirt or
//     the node's return ends it);
//  3. its dataVolumeTemplates are dropped, so that KubeVirt does not take their DataVolumes back;
//  4. its disks are released from it: the VirtualMachine's owner reference is removed from the
//     DataVolumes and claims it owns, so that its deletion does not collect them;
//  5. it is deleted. The pair starts on the next reconcile.
//
// A VirtualMachine of that name that comes back later (a GitOps tool that still has it) is
// stopped and removed the same way, with a warning.

// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachines,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=cdi.kubevirt.io,resources=datavolumes,verbs=list;patch

// dataVolumeKind is CDI's DataVolume, read and patched by metadata only: lockstep does not depend
// on CDI's API, and a cluster without CDI has none.
var dataVolumeKind = schema.GroupVersionKind{Group: "cdi.kubevirt.io", Version: "v1beta1", Kind: "DataVolume"}

// phaseAdopt ends the VirtualMachine that spec.adoptFrom names; s.adopting says what it waits for.
func (r *FaultTolerantVMReconciler) phaseAdopt(ctx context.Context, s *scope) error {
	from := s.ftvm.Spec.AdoptFrom
	if from == nil {
		return nil
	}
	if first, err := r.firstAdopter(ctx, s.ftvm); err != nil {
		return err
	} else if first != s.ftvm.Name {
		// Admission refuses a second adopter, from a cache that two creates close together can
		// both pass: the oldest adopter has the VM; the others never start.
		s.adopting = fmt.Sprintf("FaultTolerantVM %s adopts VirtualMachine %s already; delete this one", first, from.VirtualMachineName)
		s.requeueWithin(r.Config.RetryInterval)
		return nil
	}
	vm, vmi, err := r.adoptedVM(ctx, s, types.NamespacedName{Namespace: s.ftvm.Namespace, Name: from.VirtualMachineName})
	if err != nil {
		return err
	}
	if vm == nil && vmi == nil {
		return nil
	}
	s.requeueWithin(r.Config.RetryInterval)
	returned := len(s.members) > 0
	switch {
	case vm != nil && vm.DeletionTimestamp != nil:
		// Deleted by someone else (a GitOps tool that pruned it, say): keep what of its disks the
		// garbage collector has not taken yet.
		if _, err := r.releaseDisksOf(ctx, vm); err != nil {
			return err
		}
		s.adopting = fmt.Sprintf("VirtualMachine %s is being deleted", vm.Name)
		return nil
	case vm != nil && !vmHalted(vm):
		if returned {
			r.Recorder.Eventf(s.ftvm, nil, corev1.EventTypeWarning, ftv1.ReasonVirtualMachineReturned, "Adopt",
				"VirtualMachine %s, adopted by this FaultTolerantVM, exists again and runs: stopping and removing it. Remove it from wherever it comes from.", vm.Name)
		} else {
			r.announceIdentityChanges(s, vm, vmi)
			r.Recorder.Eventf(s.ftvm, nil, corev1.EventTypeNormal, ftv1.ReasonAdopting, "Adopt",
				"stopping VirtualMachine %s to take it over; the pair starts on its disks once it is gone", vm.Name)
		}
		if err := haltVM(ctx, r.Client, vm); err != nil {
			return fmt.Errorf("stopping VirtualMachine %s: %w", vm.Name, err)
		}
		s.adopting = fmt.Sprintf("stopping VirtualMachine %s", vm.Name)
		return nil
	case vmi != nil:
		s.adopting = fmt.Sprintf("waiting for VirtualMachineInstance %s (phase %s, node %s) to stop", vmi.Name, vmi.Status.Phase, orUnknown(vmi.Status.NodeName))
		return nil
	}
	return r.removeAdopted(ctx, s, vm)
}

// adoptedVM reads the VirtualMachine that ftvm adopts, and a VMI of its name that is not a member
// (one it runs, or one it left running when it was deleted with --cascade=orphan); nil for each
// that does not exist.
func (r *FaultTolerantVMReconciler) adoptedVM(ctx context.Context, s *scope, key types.NamespacedName) (*virtv1.VirtualMachine, *virtv1.VirtualMachineInstance, error) {
	if len(s.members) > 0 {
		// Adopted before the pair started: while the VirtualMachine stays gone (the watch on
		// VirtualMachines' metadata wakes this reconcile if it comes back), a reconcile costs the
		// API server nothing here.
		meta := &metav1.PartialObjectMetadata{}
		meta.SetGroupVersionKind(virtv1.VirtualMachineGroupVersionKind)
		if err := r.Get(ctx, key, meta); apierrors.IsNotFound(err) {
			return nil, nil, nil
		} else if err != nil {
			return nil, nil, err
		}
	}
	vm := &virtv1.VirtualMachine{}
	if err := r.APIReader.Get(ctx, key, vm); apierrors.IsNotFound(err) {
		vm = nil
	} else if err != nil {
		return nil, nil, err
	}
	vmi := &virtv1.VirtualMachineInstance{}
	if err := r.APIReader.Get(ctx, key, vmi); apierrors.IsNotFound(err) || (err == nil && vmi.Labels[ftv1.LabelPair] != "") {
		vmi = nil
	} else if err != nil {
		return nil, nil, err
	}
	return vm, vmi, nil
}

// removeAdopted removes a stopped VirtualMachine, its disks kept: its dataVolumeTemplates first,
// then its owner references, then itself.
func (r *FaultTolerantVMReconciler) removeAdopted(ctx context.Context, s *scope, vm *virtv1.VirtualMachine) error {
	if len(vm.Spec.DataVolumeTemplates) > 0 {
		// KubeVirt's VirtualMachine controller adopts the DataVolumes its templates name again
		// when they have no owner: without the templates, nothing takes them back before the
		// VirtualMachine is gone.
		base := vm.DeepCopy()
		vm.Spec.DataVolumeTemplates = nil
		if err := r.Patch(ctx, vm, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return fmt.Errorf("dropping VirtualMachine %s's dataVolumeTemplates: %w", vm.Name, err)
		}
		s.adopting = fmt.Sprintf("releasing VirtualMachine %s's disks", vm.Name)
		return nil
	}
	released, err := r.releaseDisksOf(ctx, vm)
	if err != nil {
		return err
	}
	if err := r.Delete(ctx, vm, client.Preconditions{UID: &vm.UID}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("removing VirtualMachine %s: %w", vm.Name, err)
	}
	r.Recorder.Eventf(s.ftvm, nil, corev1.EventTypeNormal, ftv1.ReasonAdopted, "Adopt",
		"removed VirtualMachine %s; its disks stay for the pair%s", vm.Name, releasedNote(released))
	s.adopting = fmt.Sprintf("VirtualMachine %s is being removed", vm.Name)
	return nil
}

// firstAdopter is the oldest FaultTolerantVM of the namespace (by creation, then name) that adopts
// the VirtualMachine ftvm adopts.
func (r *FaultTolerantVMReconciler) firstAdopter(ctx context.Context, ftvm *ftv1.FaultTolerantVM) (string, error) {
	var list ftv1.FaultTolerantVMList
	if err := r.List(ctx, &list, client.InNamespace(ftvm.Namespace), client.MatchingFields{indexFTVMAdoptFrom: ftvm.Spec.AdoptFrom.VirtualMachineName}); err != nil {
		return "", err
	}
	first := ftvm
	for i := range list.Items {
		f := &list.Items[i]
		if f.CreationTimestamp.Before(&first.CreationTimestamp) || (f.CreationTimestamp.Equal(&first.CreationTimestamp) && f.Name < first.Name) {
			first = f
		}
	}
	return first.Name, nil
}

// announceIdentityChanges warns, before the adopted VM is stopped, when the template would give
// its guest a new firmware UUID or MAC address.
func (r *FaultTolerantVMReconciler) announceIdentityChanges(s *scope, vm *virtv1.VirtualMachine, vmi *virtv1.VirtualMachineInstance) {
	if changes := adoption.IdentityChanges(s.ftvm.Spec.Template, vm, vmi); len(changes) > 0 {
		r.Recorder.Eventf(s.ftvm, nil, corev1.EventTypeWarning, ftv1.ReasonAdoptionIdentityChanged, "Adopt",
			"the template gives VirtualMachine %s's guest new hardware: %s (kubectl ftvm adopt writes a template that keeps it)", vm.Name, strings.Join(changes, "; "))
	}
}

// vmHalted says whether a VirtualMachine is set to stay stopped.
func vmHalted(vm *virtv1.VirtualMachine) bool {
	if vm.Spec.RunStrategy != nil {
		return *vm.Spec.RunStrategy == virtv1.RunStrategyHalted
	}
	return vm.Spec.Running != nil && !*vm.Spec.Running //nolint:staticcheck // KubeVirt still serves spec.running
}

// annotationRunStrategyBeforeAdoption, on a VirtualMachine being adopted, is the run strategy it
// had before the operator halted it: a FaultTolerantVM released (deleted with onDelete Release)
// before its adoption finished gives it back (releaseVM).
const annotationRunStrategyBeforeAdoption = ftv1.ReservedPrefix + "run-strategy-before-adoption"

// haltVM sets a VirtualMachine's runStrategy to Halted (and drops the older spec.running, which
// KubeVirt refuses beside it), at the resourceVersion read, noting the strategy it had.
func haltVM(ctx context.Context, c client.Client, vm *virtv1.VirtualMachine) error {
	before := string(virtv1.RunStrategyAlways)
	if vm.Spec.RunStrategy != nil {
		before = string(*vm.Spec.RunStrategy)
	}
	base := vm.DeepCopy()
	if vm.Annotations == nil {
		vm.Annotations = map[string]string{}
	}
	if _, noted := vm.Annotations[annotationRunStrategyBeforeAdoption]; !noted {
		vm.Annotations[annotationRunStrategyBeforeAdoption] = before
	}
	halted := virtv1.RunStrategyHalted
	vm.Spec.RunStrategy = &halted
	vm.Spec.Running = nil //nolint:staticcheck // KubeVirt still serves spec.running
	return c.Patch(ctx, vm, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
}

// releaseDisksOf removes vm as owner from the DataVolumes and claims it owns (those of its
// dataVolumeTemplates, and a claim CDI handed to it when it collected a DataVolume), so that
// deleting vm leaves them. It returns their names.
func (r *FaultTolerantVMReconciler) releaseDisksOf(ctx context.Context, vm *virtv1.VirtualMachine) ([]string, error) {
	var released []string
	for _, gvk := range []schema.GroupVersionKind{dataVolumeKind, corev1.SchemeGroupVersion.WithKind("PersistentVolumeClaim")} {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := r.APIReader.List(ctx, list, client.InNamespace(vm.Namespace)); apimeta.IsNoMatchError(err) {
			continue // CDI is not installed
		} else if err != nil {
			return nil, err
		}
		for i := range list.Items {
			obj := &list.Items[i]
			kept := withoutOwner(obj.OwnerReferences, vm.UID)
			if len(kept) == len(obj.OwnerReferences) {
				continue
			}
			base := obj.DeepCopy()
			obj.OwnerReferences = kept
			if err := r.Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
				return nil, fmt.Errorf("releasing %s %s from VirtualMachine %s: %w", gvk.Kind, obj.Name, vm.Name, err)
			}
			released = append(released, gvk.Kind+" "+obj.Name)
		}
	}
	return released, nil
}

func withoutOwner(refs []metav1.OwnerReference, uid types.UID) []metav1.OwnerReference {
	out := []metav1.OwnerReference{}
	for _, ref := range refs {
		if ref.UID != uid {
			out = append(out, ref)
		}
	}
	return out
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func releasedNote(released []string) string {
	if len(released) == 0 {
		return ""
	}
	return " (released from it: " + strings.Join(released, ", ") + ")"
}
