package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/health"
	"github.com/lockstep-dev/lockstep/internal/member"
)

// Replicas. Under COLO, a secondary's copies of the disks hold its replicas of the primary's
// disks once lockstepd marked it synchronized: every block the primary writes reaches them
// through block replication, while the secondary's own writes go to its overlays, which die with
// it. A secondary lost without going live leaves them the primary's disks as of when it was
// dropped. A later secondary of the same primary, on the same node, takes them over, and the
// primary's engine copies only what its VM wrote since (its dirty bitmaps), not the whole disks.
//
// Each fact has one writer, the operator:
//   - a copy's AnnotationReplicaOf names the secondary that was marked synchronized with it
//     (phaseRecordReplicas);
//   - a copy's LabelMember, LabelNode and ordinal name the member that uses it; a hand-over moves
//     them to the new secondary, one patch a copy, before that secondary is created (handOver);
//   - the new secondary's AnnotationReplicaOf, from its copies, when it is created.
//
// Copies are handed on only by the member that was synchronized with them (LabelMember equals
// AnnotationReplicaOf). So copies handed to a secondary that never synchronized (one that could
// not reach its primary) are not put back on that node again and again, and copies that a crash
// left half handed over are not used. The engine decides in the end: it copies only the
// difference when its bitmaps count from the secondary named, and the whole disks otherwise.
// A copy that a member that ever went live used is never handed over: it follows another
// primary, or is marked as a primary's disk.

// replicaSet is the copies of every volume that one earlier secondary left.
type replicaSet struct {
	of     string                                   // the secondary whose replicas they hold
	node   string                                   // where they were used
	copies map[string]*corev1.PersistentVolumeClaim // volume -> copy
}

// reusableReplicas finds the copies a new secondary of primary can take over: for every one of
// volumes, the copy of tracked (the secondary that the primary's engine last resynchronised,
// whose replicas its dirty bitmaps count from), which no longer exists (present lists the members
// that do, being deleted or not) and was synchronized with them, made for a secondary of
// primary, holding a disk of the size bytes gives, never a primary's disk, all on one node.
func reusableReplicas(copies []corev1.PersistentVolumeClaim, primary, tracked string, present map[string]bool, volumes []string, bytes member.DiskBytes) (replicaSet, bool) {
	if tracked == "" || present[tracked] {
		return replicaSet{}, false
	}
	set := replicaSet{of: tracked, copies: map[string]*corev1.PersistentVolumeClaim{}}
	for i := range copies {
		c := &copies[i]
		if c.Annotations[ftv1.AnnotationReplicaOf] != tracked || c.Labels[ftv1.LabelMember] != tracked || c.DeletionTimestamp != nil ||
			c.Annotations[ftv1.AnnotationFollows] != primary || c.Annotations[annotationWasPrimary] == annotationTrue {
			continue
		}
		volume, node := c.Labels[labelVolume], c.Labels[ftv1.LabelNode]
		if set.node == "" {
			set.node = node
		}
		n, sized := bytes[volume]
		if node == "" || node != set.node || set.copies[volume] != nil ||
			(sized && c.Annotations[ftv1.AnnotationDiskBytes] != strconv.FormatInt(n, 10)) {
			return replicaSet{}, false // not one whole set on one node
		}
		set.copies[volume] = c
	}
	if len(set.copies) != len(volumes) {
		return replicaSet{}, false
	}
	for _, v := range volumes {
		if set.copies[v] == nil {
			return replicaSet{}, false
		}
	}
	return set, true
}

// copiesWait is how long a new secondary waits for the VMI of a dropped secondary to go, so that
// it can take over that secondary's copies; copiesRecheck how often it looks meanwhile.
const (
	copiesWait    = time.Minute
	copiesRecheck = 2 * time.Second
)

// errWaitingForCopies: a new secondary waits for a dropped secondary's VMI to go, to take over
// its copies (copiesWait).
var errWaitingForCopies = errors.New("waiting to take over the copies of the disks that the last secondary left")

// replicasFor finds the copies a new secondary of s's primary can take over (reusableReplicas),
// under COLO only. When the copies of a secondary that is being deleted would do, and its node
// is well, it returns errWaitingForCopies for up to copiesWait after that deletion began: its
// QEMU may still hold them.
func (r *FaultTolerantVMReconciler) replicasFor(ctx context.Context, s *scope, volumes map[string]string, bytes member.DiskBytes) (replicaSet, bool, error) {
	if !r.Config.Member.COLO.Enabled || bytes == nil || len(volumes) == 0 {
		return replicaSet{}, false, nil
	}
	copies, err := r.diskCopies(ctx, s.ftvm)
	if err != nil {
		return replicaSet{}, false, err
	}
	present := map[string]bool{}
	for _, mv := range slices.Concat(s.members, s.gone) {
		present[mv.vmi.Name] = true
	}
	names := slices.Sorted(maps.Keys(volumes))
	// The secondary the primary's engine last resynchronised, as its lockstepd reports it: the
	// engine catches up only into that one's copies (after a restart of lockstepd there, none).
	tracked := ""
	if last := s.ftvm.Status.LastResync; last != nil {
		tracked = last.Secondary
	}
	set, ok := reusableReplicas(copies, s.primary.vmi.Name, tracked, present, names, bytes)
	if ok {
		return set, true, nil
	}
	// That secondary may still be going (deleted, or dropped by this reconcile).
	leaving := slices.Concat(s.gone, s.dropped)
	i := slices.IndexFunc(leaving, func(mv *memberView) bool {
		return mv.vmi.Name == tracked && mv.vmi.Labels[ftv1.LabelRole] == ftv1.RoleSecondary
	})
	if i < 0 {
		return replicaSet{}, false, nil
	}
	going := leaving[i]
	since := time.Duration(0) // dropped by this reconcile
	if going.vmi.DeletionTimestamp != nil {
		since = s.now.Sub(going.vmi.DeletionTimestamp.Time)
	}
	if since >= copiesWait {
		return replicaSet{}, false, nil
	}
	node := &corev1.Node{}
	if err := r.Get(ctx, types.NamespacedName{Name: going.node}, node); client.IgnoreNotFound(err) != nil {
		return replicaSet{}, false, err
	} else if err != nil || !health.NodeWell(node, s.now, s.grace) || node.Spec.Unschedulable {
		return replicaSet{}, false, nil // a node that is down may never let its VMI go; a cordoned one takes no member
	}
	delete(present, tracked)
	if _, ok := reusableReplicas(copies, s.primary.vmi.Name, tracked, present, names, bytes); ok {
		return replicaSet{}, false, fmt.Errorf("%w: %s, on node %s, is being deleted (for %s; a new secondary waits %s at most)",
			errWaitingForCopies, tracked, going.node, since.Round(time.Second), copiesWait)
	}
	return replicaSet{}, false, nil
}

// handOver makes a copy the new secondary's: its member, node and ordinal, in one patch that
// fails if the copy changed since it was read from the API server here (a copy that changed
// hands, or is being deleted, is not taken). Its AnnotationReplicaOf stays: it still names whose
// replicas it holds.
func (r *FaultTolerantVMReconciler) handOver(ctx context.Context, cached *corev1.PersistentVolumeClaim, memberName, node string, ordinal int) error {
	c := &corev1.PersistentVolumeClaim{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(cached), c); err != nil {
		return err
	}
	if c.UID == cached.UID && c.Labels[ftv1.LabelMember] == memberName {
		return nil // handed over already
	}
	if c.UID != cached.UID || c.DeletionTimestamp != nil || c.Labels[ftv1.LabelMember] != cached.Labels[ftv1.LabelMember] ||
		c.Annotations[ftv1.AnnotationReplicaOf] != cached.Annotations[ftv1.AnnotationReplicaOf] {
		return apierrors.NewConflict(corev1.Resource("persistentvolumeclaims"), c.Name, errors.New("the copy changed since the hand-over was decided"))
	}
	base := c.DeepCopy()
	c.Labels[ftv1.LabelMember], c.Labels[ftv1.LabelNode] = memberName, node
	c.Annotations[ftv1.AnnotationOrdinal] = strconv.Itoa(ordinal)
	if err := r.Patch(ctx, c, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return err
	}
	log.FromContext(ctx).Info("handed a secondary's copy of a disk to the next secondary", "claim", c.Name, "replica-of", c.Annotations[ftv1.AnnotationReplicaOf], "to", memberName)
	return nil
}

// phaseRecordReplicas notes, under COLO, on each copy of a synchronized secondary that it holds
// that secondary's replicas (the one writer of AnnotationReplicaOf on copies).
func (r *FaultTolerantVMReconciler) phaseRecordReplicas(ctx context.Context, s *scope) error {
	if !r.Config.Member.COLO.Enabled || s.primary == nil || s.secondary == nil || !s.holdsState(s.secondary) {
		return nil
	}
	sec := s.secondary.vmi
	if sec.Annotations[ftv1.AnnotationFollows] != s.primary.vmi.Name {
		return nil
	}
	copies, err := r.diskCopies(ctx, s.ftvm)
	if err != nil {
		return err
	}
	for i := range copies {
		c := &copies[i]
		if c.Labels[ftv1.LabelMember] != sec.Name || c.Annotations[ftv1.AnnotationReplicaOf] == sec.Name || c.DeletionTimestamp != nil {
			continue
		}
		if err := patchAnnotation(ctx, r.Client, c, ftv1.AnnotationReplicaOf, sec.Name); err != nil {
			return client.IgnoreNotFound(err)
		}
	}
	return nil
}
