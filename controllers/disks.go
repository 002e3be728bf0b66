package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
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
	"github.com/lockstep-dev/lockstep/internal/member"
	"github.com/lockstep-dev/lockstep/internal/validation"
)

// Disks. COLO replicates the primary's writes to the secondary, so each member has its own copy
// of every persistent disk (as vSphere 6+ keeps one per member). The first primary uses the
// user's claims. Every other member gets a blank copy of each claim, which the engine fills by
// resynchronising from the primary. A copy whose member became primary is marked: it then holds
// the VM's disk, and a VM restarted after halting, or after losing a primary that had no running
// secondary, starts from the marked copies of the newest such member.
//
// The user's claims are never deleted; once a copy of one becomes the VM's disk, the user's claim
// is annotated as superseded by it (it holds an older state from then on). Copies are owned by
// the FaultTolerantVM and deleted once no member uses them and they are not the VM's current
// disk; when the FaultTolerantVM is deleted, the copies that hold the VM's current disks are kept
// unless spec.diskRetention says Delete (retainCurrentDisks).

// annotationWasPrimary marks a copy whose member was primary, with the value "true".
const annotationWasPrimary = "ft.lockstep.dev/was-primary"

const annotationTrue = "true"

// errSourceClaim: a claim the template names does not exist, or cannot be used.
var errSourceClaim = errors.New("source claim not found or not usable")

// copyName is the claim of a member's copy of a volume.
func copyName(memberName, volume string) string {
	name := memberName + "-" + volume
	if len(name) > 253 {
		name = name[:253]
	}
	return name
}

// pvcVolumes are the template's persistent volumes: volume name -> the user's claim (a
// persistentVolumeClaim's, or the claim of a dataVolume, which CDI names as the DataVolume).
func pvcVolumes(spec *virtv1.VirtualMachineInstanceSpec) map[string]string {
	out := map[string]string{}
	for i := range spec.Volumes {
		if claim := member.ClaimOf(&spec.Volumes[i]); claim != "" {
			out[spec.Volumes[i].Name] = claim
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

// memberDisks are a new member's disks: the claim of each persistent volume, the size of each
// claim, and under COLO the exact size of each replicated disk where it is known (member.DiskBytes).
type memberDisks struct {
	claims map[string]string
	sizes  map[string]resource.Quantity
	bytes  member.DiskBytes
}

// ensureMemberClaims gives a new member m its disks. A primary uses the VM's current disks; a
// secondary takes over reuse's copies when given (replicas.go), else gets blank copies, each
// large enough for the disk of bytes it will hold. m.DiskBytes, which the caller decided (a
// secondary's: its primary's; a primary's: those of the copies it starts from,
// currentDiskBytes; nil without COLO), comes back unchanged.
func (r *FaultTolerantVMReconciler) ensureMemberClaims(ctx context.Context, ftvm *ftv1.FaultTolerantVM, spec *virtv1.VirtualMachineInstanceSpec,
	memberName string, m member.Member, reuse *replicaSet) (memberDisks, error) {
	ordinal, role, bytes := m.Ordinal, m.Role, m.DiskBytes
	out := memberDisks{claims: map[string]string{}, sizes: map[string]resource.Quantity{}, bytes: bytes}
	volumes := pvcVolumes(spec)
	if len(volumes) == 0 {
		return out, nil
	}
	copies, err := r.diskCopies(ctx, ftvm)
	if err != nil {
		return out, err
	}

	names := slices.Sorted(maps.Keys(volumes)) // one order of writes
	// Every claim of the template is read and judged before anything is written, so that a
	// claim that cannot be used leaves no copy half handed over.
	sources, err := r.sourceClaims(ctx, ftvm, volumes, role, copies)
	if err != nil {
		return out, err
	}
	for _, volume := range names {
		userClaim, source := volumes[volume], sources[volume]
		out.sizes[volume] = capacityOf(source)
		if role == ftv1.RolePrimary {
			out.claims[volume] = currentDisk(copies, volume, userClaim)
			if out.claims[volume] != userClaim {
				if err := r.markWasPrimary(ctx, ftvm.Namespace, out.claims[volume]); err != nil {
					return out, err
				}
			}
			continue
		}
		if reuse != nil {
			c := reuse.copies[volume]
			if err := r.handOver(ctx, c, memberName, m.Node, ordinal); err != nil {
				return out, fmt.Errorf("handing the copy %s of %s to %s: %w", c.Name, reuse.of, memberName, err)
			}
			out.claims[volume] = c.Name
			continue
		}
		name := copyName(memberName, volume)
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{
				Name:      name,
				Namespace: ftvm.Namespace,
				Labels: map[string]string{
					ftv1.LabelPair: ftvm.Name, ftv1.LabelMember: memberName, labelVolume: volume,
					ftv1.LabelManagedBy: ftv1.ManagedByValue, ftv1.LabelNode: m.Node,
				},
				Annotations: map[string]string{ftv1.AnnotationSourceClaim: userClaim, ftv1.AnnotationOrdinal: strconv.Itoa(ordinal)},
			},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      source.Spec.AccessModes,
				StorageClassName: source.Spec.StorageClassName,
				VolumeMode:       source.Spec.VolumeMode,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: capacityOf(source)}},
			},
		}
		if m.Follows != "" {
			pvc.Annotations[ftv1.AnnotationFollows] = m.Follows
		}
		if n, ok := bytes[volume]; ok {
			// The copy holds a disk of n bytes: its claim asks for that and its filesystem's
			// overhead, and says which size it holds for a primary that starts from it later.
			pvc.Spec.Resources.Requests[corev1.ResourceStorage] = member.CopyRequest(n, capacityOf(source))
			pvc.Annotations[ftv1.AnnotationDiskBytes] = strconv.FormatInt(n, 10)
		}
		if err := controllerutil.SetControllerReference(ftvm, pvc, r.Scheme); err != nil {
			return out, err
		}
		if err := r.Create(ctx, pvc); err != nil && !apierrors.IsAlreadyExists(err) {
			return out, fmt.Errorf("creating the disk copy %s: %w", name, err)
		}
		out.claims[volume] = name
	}
	return out, nil
}

// currentDiskBytes is the exact size of each replicated disk when every one's current disk is a
// copy the operator made (a VM restarted after a failover): each copy says the size of the disk
// it holds. Otherwise nil: the VM's disks are the template's claims, whose images are what they
// are until the VM runs and lockstepd measures them.
func currentDiskBytes(copies []corev1.PersistentVolumeClaim, spec *virtv1.VirtualMachineInstanceSpec) member.DiskBytes {
	disks, err := member.ReplicatedDisks(spec)
	if err != nil {
		return nil
	}
	volumes := pvcVolumes(spec)
	bytes := member.DiskBytes{}
	for _, d := range disks {
		name := currentDisk(copies, d, volumes[d])
		i := slices.IndexFunc(copies, func(c corev1.PersistentVolumeClaim) bool { return c.Name == name })
		if i < 0 {
			return nil
		}
		n, err := strconv.ParseInt(copies[i].Annotations[ftv1.AnnotationDiskBytes], 10, 64)
		if err != nil || n <= 0 {
			return nil
		}
		bytes[d] = n
	}
	return bytes
}

// errDiskSizesUnknown: under COLO, a secondary waits until its primary's disk sizes are known.
var errDiskSizesUnknown = errors.New("the sizes of the primary's disks are not known yet")

// secondaryDiskBytes are the disk sizes a new COLO secondary of primary is built with: the
// primary's, which must be known (errDiskSizesUnknown) and ones a secondary can have
// (member.ErrDiskSizeUnsupported). Without COLO, nil.
func (r *FaultTolerantVMReconciler) secondaryDiskBytes(primary *virtv1.VirtualMachineInstance, spec *virtv1.VirtualMachineInstanceSpec) (member.DiskBytes, error) {
	if !r.Config.Member.COLO.Enabled {
		return nil, nil
	}
	bytes, err := member.PrimaryDiskBytes(primary)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errDiskSizesUnknown, err)
	}
	if bytes == nil {
		node := primary.Labels[ftv1.LabelNode]
		return nil, fmt.Errorf("%w: a COLO secondary's images must be exactly as large as the primary's disks, which lockstepd on node %s reports once primary %s runs (annotation %s)",
			errDiskSizesUnknown, node, primary.Name, ftv1.AnnotationMeasuredDiskBytes)
	}
	disks, err := member.ReplicatedDisks(spec)
	if err != nil {
		return nil, err
	}
	if err := bytes.Covers(disks); err != nil {
		if errors.Is(err, member.ErrDiskSizeUnsupported) {
			return nil, fmt.Errorf("primary %s: %w", primary.Name, err)
		}
		// Sizes that miss a disk (a member made before every disk was replicated): the
		// secondary waits, and the status says which disk.
		return nil, fmt.Errorf("%w: primary %s: %w", errDiskSizesUnknown, primary.Name, err)
	}
	return bytes, nil
}

// capacityOf is the size of a claim: what it got, else what it asked for.
func capacityOf(pvc *corev1.PersistentVolumeClaim) resource.Quantity {
	if q, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok {
		return q
	}
	return pvc.Spec.Resources.Requests[corev1.ResourceStorage]
}

// markWasPrimary marks a copy as the disk of a primary, and then the user's claim it copies as
// superseded by it. Each write is made only when missing, so that a crash between them is
// repaired by the next call.
func (r *FaultTolerantVMReconciler) markWasPrimary(ctx context.Context, namespace, claim string) error {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: claim}, pvc); err != nil {
		return client.IgnoreNotFound(err) // the user's claim, or gone
	}
	if pvc.Labels[ftv1.LabelManagedBy] != ftv1.ManagedByValue {
		return nil
	}
	if err := patchAnnotation(ctx, r.Client, pvc, annotationWasPrimary, annotationTrue); err != nil {
		return err
	}
	source := pvc.Annotations[ftv1.AnnotationSourceClaim]
	if source == "" {
		return nil
	}
	// The user's claims are not in the cache (it holds the operator's own).
	user := &corev1.PersistentVolumeClaim{}
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: source}, user); err != nil {
		return client.IgnoreNotFound(err)
	}
	return patchAnnotation(ctx, r.Client, user, ftv1.AnnotationSupersededBy, claim)
}

// sourceClaims reads and judges the template's claims (volume -> claim) for a new member of
// role, writing nothing: errSourceClaim when one cannot be used. The callers check before they
// write the record, so that a refused start spends no epoch and no name.
func (r *FaultTolerantVMReconciler) sourceClaims(ctx context.Context, ftvm *ftv1.FaultTolerantVM, volumes map[string]string, role string,
	copies []corev1.PersistentVolumeClaim) (map[string]*corev1.PersistentVolumeClaim, error) {
	sources := map[string]*corev1.PersistentVolumeClaim{}
	for _, volume := range slices.Sorted(maps.Keys(volumes)) {
		userClaim := volumes[volume]
		source := &corev1.PersistentVolumeClaim{}
		if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ftvm.Namespace, Name: userClaim}, source); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("%w: volume %q names claim %q, which does not exist", errSourceClaim, volume, userClaim)
			}
			return nil, err
		}
		if why := validation.ClaimProblem(source, r.Config.Member.COLO.Enabled); why != "" {
			return nil, fmt.Errorf("%w: volume %q: claim %q %s", errSourceClaim, volume, userClaim, why)
		}
		if role == ftv1.RolePrimary && currentDisk(copies, volume, userClaim) == userClaim {
			if err := r.notSuperseded(ctx, source, volume); err != nil {
				return nil, err
			}
		}
		sources[volume] = source
	}
	return sources, nil
}

// checkClaims says, writing nothing, whether a new member of role can have its disks.
func (r *FaultTolerantVMReconciler) checkClaims(ctx context.Context, ftvm *ftv1.FaultTolerantVM, spec *virtv1.VirtualMachineInstanceSpec, role string) error {
	volumes := pvcVolumes(spec)
	if len(volumes) == 0 {
		return nil
	}
	copies, err := r.diskCopies(ctx, ftvm)
	if err != nil {
		return err
	}
	_, err = r.sourceClaims(ctx, ftvm, volumes, role, copies)
	return err
}

// notSuperseded refuses to start the VM from a claim of the template that a failover superseded,
// while the claim that superseded it is there: that one holds the VM's newer disk, and the
// template names the older one only because its volume was renamed (the pair's copies are known
// by volume) or the claim reused. A person decides: name the newer claim in the template, or
// remove the annotation to start from the older state on purpose.
func (r *FaultTolerantVMReconciler) notSuperseded(ctx context.Context, user *corev1.PersistentVolumeClaim, volume string) error {
	by := user.Annotations[ftv1.AnnotationSupersededBy]
	if by == "" {
		return nil
	}
	newer := &corev1.PersistentVolumeClaim{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: user.Namespace, Name: by}, newer)
	switch {
	case apierrors.IsNotFound(err) || err == nil && newer.DeletionTimestamp != nil:
		return nil // the newer disk is gone: the template's claim is the VM's only disk
	case err != nil:
		return err
	}
	return fmt.Errorf("%w: volume %q: claim %q holds an older state of the VM's disk: a failover made claim %q the VM's disk (annotation %s); name %q in the template's volume, or remove the annotation from %q to start from the older state on purpose",
		errSourceClaim, volume, user.Name, by, ftv1.AnnotationSupersededBy, by, user.Name)
}

// patchAnnotation sets an annotation of a claim, unless it has that value already.
func patchAnnotation(ctx context.Context, c client.Client, pvc *corev1.PersistentVolumeClaim, key, value string) error {
	if pvc.Annotations[key] == value {
		return nil
	}
	base := pvc.DeepCopy()
	if pvc.Annotations == nil {
		pvc.Annotations = map[string]string{}
	}
	pvc.Annotations[key] = value
	return c.Patch(ctx, pvc, client.MergeFrom(base))
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

// retainCurrentDisks keeps, for a FaultTolerantVM being deleted with diskRetention Retain, each
// copy that holds the VM's current disk (a volume whose newest primary ran on a copy, not on the
// user's claim): in one patch each, it loses the FaultTolerantVM as owner and the labels that
// make it a copy, and gets LabelRetainedFrom. A volume that a claim retained from this
// FaultTolerantVM (its UID) already holds is done, so that a crash between two patches never
// makes an older copy look current. It returns every claim retained from this FaultTolerantVM.
func (r *FaultTolerantVMReconciler) retainCurrentDisks(ctx context.Context, ftvm *ftv1.FaultTolerantVM) ([]string, error) {
	if ftvm.Spec.DiskRetention == ftv1.DiskRetentionDelete && ftvm.Spec.OnDelete != ftv1.OnDeleteRelease {
		return nil, nil
	}
	var retained corev1.PersistentVolumeClaimList
	if err := r.APIReader.List(ctx, &retained, client.InNamespace(ftvm.Namespace), client.MatchingLabels{ftv1.LabelRetainedFrom: ftvm.Name}); err != nil {
		return nil, err
	}
	done := map[string]bool{}
	var kept []string
	for _, c := range retained.Items {
		if c.Annotations[ftv1.AnnotationRetainedFromUID] == string(ftvm.UID) {
			done[c.Labels[labelVolume]] = true
			kept = append(kept, retainedNote(&c))
		}
	}
	var copies corev1.PersistentVolumeClaimList
	if err := r.APIReader.List(ctx, &copies, client.InNamespace(ftvm.Namespace), client.MatchingLabels{ftv1.LabelPair: ftvm.Name, ftv1.LabelManagedBy: ftv1.ManagedByValue}); err != nil {
		return nil, err
	}
	for _, volume := range copyVolumes(copies.Items) {
		current := currentDisk(copies.Items, volume, "")
		if current == "" || done[volume] {
			continue
		}
		for i := range copies.Items {
			if c := &copies.Items[i]; c.Name == current && c.DeletionTimestamp == nil {
				if err := r.releaseCopy(ctx, ftvm, c); err != nil {
					return kept, fmt.Errorf("keeping claim %s, the VM's current disk of volume %s: %w", c.Name, volume, err)
				}
				kept = append(kept, retainedNote(c))
			}
		}
	}
	sort.Strings(kept)
	return kept, nil
}

func retainedNote(c *corev1.PersistentVolumeClaim) string {
	return fmt.Sprintf("%s (volume %s, in place of claim %s)", c.Name, c.Labels[labelVolume], c.Annotations[ftv1.AnnotationSourceClaim])
}

// copyVolumes are the volumes the copies are of, sorted.
func copyVolumes(copies []corev1.PersistentVolumeClaim) []string {
	seen := map[string]bool{}
	var out []string
	for _, c := range copies {
		if v := c.Labels[labelVolume]; v != "" && !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	sort.Strings(out)
	return out
}

// releaseCopy makes a copy a claim of the user's: no owner, not labelled as a copy, labelled as
// retained from ftvm.
func (r *FaultTolerantVMReconciler) releaseCopy(ctx context.Context, ftvm *ftv1.FaultTolerantVM, c *corev1.PersistentVolumeClaim) error {
	base := c.DeepCopy()
	var owners []metav1.OwnerReference
	for _, o := range c.OwnerReferences {
		if o.UID != ftvm.UID {
			owners = append(owners, o)
		}
	}
	c.OwnerReferences = owners
	delete(c.Labels, ftv1.LabelPair)
	delete(c.Labels, ftv1.LabelManagedBy)
	delete(c.Labels, ftv1.LabelMember)
	c.Labels[ftv1.LabelRetainedFrom] = ftvm.Name
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[ftv1.AnnotationRetainedFromUID] = string(ftvm.UID)
	return r.Patch(ctx, c, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
}
