package controllers

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// Disks. COLO replicates the primary's writes to the secondary, so each member has its own copy
// of every persistent disk (as vSphere 6+ keeps one per member). The first primary uses the
// user's claims. Every other member gets a blank copy of each claim, which the engine fills by
// resynchronising from the primary. A copy whose member became primary is marked: it then holds
// the VM's disk, and a VM restarted after halting, or after losing a primary that had no running
// secondary, starts from the marked copies of the newest such member.
//
// The user's claims are never changed or deleted. Copies are owned by the FaultTolerantVM and
// deleted once no member uses them and they are not the VM's current disk.

// annotationWasPrimary marks a copy whose member was primary, with the value "true".
const annotationWasPrimary = "ft.lockstep.dev/was-primary"

const annotationTrue = "true"

// errSourceClaim: a claim the template names does not exist.
var errSourceClaim = errors.New("source claim not found")

// copyName is the claim of a member's copy of a volume.
func copyName(memberName, volume string) string {
	name := memberName + "-" + volume
	if len(name) > 253 {
		name = name[:253]
	}
	return name
}

// pvcVolumes are the template's persistent volumes: volume name -> the user's claim.
func pvcVolumes(spec *virtv1.VirtualMachineInstanceSpec) map[string]string {
	out := map[string]string{}
	for _, v := range spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			out[v.Name] = v.PersistentVolumeClaim.ClaimName
		}
	}
	return out
}

// diskCopies lists the pair's copies.
func (r *FaultTolerantVMReconciler) diskCopies(ctx context.Context, ftvm *ftv1.FaultTolerantVM) ([]corev1.PersistentVolumeClaim, error) {
	var pvcs corev1.PersistentVolumeClaimList
	err := r.List(ctx, &pvcs, client.InNamespace(ftvm.Namespace), client.MatchingLabels{ftv1.LabelPair: ftvm.Name, ftv1.LabelManagedBy: ftv1.ManagedByValue})
	return pvcs.Items, err
}

// currentDisk is the claim that holds the VM's disk for a volume: the copy of the newest member
// that was primary, else the user's claim.
func currentDisk(copies []corev1.PersistentVolumeClaim, volume, userClaim string) string {
	best, bestOrdinal := userClaim, 0
	for i := range copies {
		c := &copies[i]
		if c.Annotations[annotationWasPrimary] != annotationTrue || c.Labels[labelVolume] != volume {
			continue
		}
		if o, _ := strconv.Atoi(c.Annotations[ftv1.AnnotationOrdinal]); o > bestOrdinal {
			best, bestOrdinal = c.Name, o
		}
	}
	return best
}

// labelVolume, on a copy, names the template volume it copies.
const labelVolume = "ft.lockstep.dev/volume"

// ensureMemberClaims returns the claim of each persistent volume for a new member, and the size
// of each. A primary uses the VM's current disks; a secondary gets blank copies.
func (r *FaultTolerantVMReconciler) ensureMemberClaims(ctx context.Context, ftvm *ftv1.FaultTolerantVM, spec *virtv1.VirtualMachineInstanceSpec,
	memberName string, ordinal int, role string) (map[string]string, map[string]resource.Quantity, error) {
	volumes := pvcVolumes(spec)
	if len(volumes) == 0 {
		return nil, nil, nil
	}
	copies, err := r.diskCopies(ctx, ftvm)
	if err != nil {
		return nil, nil, err
	}
	claims, sizes := map[string]string{}, map[string]resource.Quantity{}
	for volume, userClaim := range volumes {
		var source corev1.PersistentVolumeClaim
		if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ftvm.Namespace, Name: userClaim}, &source); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, nil, fmt.Errorf("%w: volume %q names claim %q, which does not exist", errSourceClaim, volume, userClaim)
			}
			return nil, nil, err
		}
		sizes[volume] = capacityOf(&source)
		if role == ftv1.RolePrimary {
			claims[volume] = currentDisk(copies, volume, userClaim)
			if claims[volume] != userClaim {
				if err := r.markWasPrimary(ctx, ftvm.Namespace, claims[volume]); err != nil {
					return nil, nil, err
				}
			}
			continue
		}
		name := copyName(memberName, volume)
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{
				Name:      name,
				Namespace: ftvm.Namespace,
				Labels: map[string]string{
					ftv1.LabelPair: ftvm.Name, ftv1.LabelMember: memberName, labelVolume: volume,
					ftv1.LabelManagedBy: ftv1.ManagedByValue,
				},
				Annotations: map[string]string{ftv1.AnnotationSourceClaim: userClaim, ftv1.AnnotationOrdinal: strconv.Itoa(ordinal)},
			},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      source.Spec.AccessModes,
				StorageClassName: source.Spec.StorageClassName,
				VolumeMode:       source.Spec.VolumeMode,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: capacityOf(&source)}},
			},
		}
		if err := controllerutil.SetControllerReference(ftvm, pvc, r.Scheme); err != nil {
			return nil, nil, err
		}
		if err := r.Create(ctx, pvc); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, nil, fmt.Errorf("creating the disk copy %s: %w", name, err)
		}
		claims[volume] = name
	}
	return claims, sizes, nil
}

// capacityOf is the size of a claim: what it got, else what it asked for.
func capacityOf(pvc *corev1.PersistentVolumeClaim) resource.Quantity {
	if q, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok {
		return q
	}
	return pvc.Spec.Resources.Requests[corev1.ResourceStorage]
}

// markWasPrimary marks a copy as the disk of a primary.
func (r *FaultTolerantVMReconciler) markWasPrimary(ctx context.Context, namespace, claim string) error {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: claim}, pvc); err != nil {
		return client.IgnoreNotFound(err) // the user's claim, or gone
	}
	if pvc.Labels[ftv1.LabelManagedBy] != ftv1.ManagedByValue || pvc.Annotations[annotationWasPrimary] == annotationTrue {
		return nil
	}
	base := pvc.DeepCopy()
	if pvc.Annotations == nil {
		pvc.Annotations = map[string]string{}
	}
	pvc.Annotations[annotationWasPrimary] = annotationTrue
	return r.Patch(ctx, pvc, client.MergeFrom(base))
}

// markPrimaryDisks marks the copies a (promoted) primary uses.
func (r *FaultTolerantVMReconciler) markPrimaryDisks(ctx context.Context, vmi *virtv1.VirtualMachineInstance) error {
	for _, v := range vmi.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			if err := r.markWasPrimary(ctx, vmi.Namespace, v.PersistentVolumeClaim.ClaimName); err != nil {
				return err
			}
		}
	}
	return nil
}

// phaseCollectDiskCopies deletes copies that no member uses and that are not the VM's current
// disk: those of members that are gone, and those of a member whose creation a crash cut short.
// It runs only while the pair is whole, and spares copies newer than the newest member, so that a
// copy made for a member the cache does not show yet is never taken.
func (r *FaultTolerantVMReconciler) phaseCollectDiskCopies(ctx context.Context, s *scope) error {
	if s.primary == nil || s.secondary == nil {
		return nil
	}
	copies, err := r.diskCopies(ctx, s.ftvm)
	if err != nil {
		return err
	}
	used := map[string]bool{}
	newest := max(s.primary.ordinal, s.secondary.ordinal)
	for _, mv := range []*memberView{s.primary, s.secondary} {
		for _, v := range mv.vmi.Spec.Volumes {
			if v.PersistentVolumeClaim != nil {
				used[v.PersistentVolumeClaim.ClaimName] = true
			}
		}
	}
	for i := range copies {
		c := &copies[i]
		ordinal, _ := strconv.Atoi(c.Annotations[ftv1.AnnotationOrdinal])
		if used[c.Name] || ordinal > newest || c.DeletionTimestamp != nil ||
			currentDisk(copies, c.Labels[labelVolume], "") == c.Name {
			continue
		}
		if err := r.Delete(ctx, c, client.Preconditions{UID: &c.UID}); client.IgnoreNotFound(err) != nil {
			return err
		}
		log.FromContext(ctx).Info("deleted stale disk copy", "claim", c.Name)
	}
	return nil
}
