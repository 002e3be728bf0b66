package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/roles"
)

// The pair's record: its Lease (api/v1alpha1/record.go). The operator reads it before every
// decision that changes a member's role and writes it, by compare-and-set, before it acts on one.

// record is the pair's record as read, with the Lease it came from (nil when there is none).
type record struct {
	lease *coordinationv1.Lease
	roles.Record
	// holderNode is the node part of the holder's identity.
	holderNode string
	// lastPromotion is when the last promotion was counted.
	lastPromotion *metav1.Time
	// suspects are the pair's suspect nodes (suspects.go).
	suspects map[string]suspicion
	// members are the identities of the pair's members on the nodes the operator placed them
	// (ftv1.AnnotationMembers).
	members []string
}

func recordKey(ftvm *ftv1.FaultTolerantVM) types.NamespacedName {
	return types.NamespacedName{Namespace: ftvm.Namespace, Name: ftv1.RecordName(ftvm.Name)}
}

// readRecord reads the pair's record from r (the cache, or the API server). A Lease controlled by
// another FaultTolerantVM (an earlier one of the same name) is not this pair's record.
func readRecord(ctx context.Context, r client.Reader, ftvm *ftv1.FaultTolerantVM) (*record, error) {
	lease := &coordinationv1.Lease{}
	if err := r.Get(ctx, recordKey(ftvm), lease); err != nil {
		if apierrors.IsNotFound(err) {
			return &record{}, nil
		}
		return nil, err
	}
	if owner := metav1.GetControllerOf(lease); owner != nil && owner.UID != ftvm.UID {
		return &record{lease: lease}, errStaleRecord
	}
	rec := &record{lease: lease}
	rec.Exists = true
	if h := ptr.Deref(lease.Spec.HolderIdentity, ""); h != "" {
		rec.holderNode, rec.Holder = ftv1.SplitIdentity(h)
	}
	if t := lease.Spec.LeaseTransitions; t != nil {
		rec.Epoch = int64(*t)
	}
	n, _ := strconv.Atoi(lease.Annotations[ftv1.AnnotationPromotions])
	rec.Promotions = int32(n)
	rec.LastPromoted = lease.Annotations[ftv1.AnnotationLastPromoted]
	rec.Operation = lease.Annotations[ftv1.AnnotationOperation]
	rec.ReservedNode = lease.Annotations[ftv1.AnnotationReservedNode]
	rec.LastOrdinal, _ = strconv.Atoi(lease.Annotations[ftv1.AnnotationLastOrdinal])
	rec.suspects = decodeSuspects(lease.Annotations[ftv1.AnnotationSuspectNodes])
	if m := lease.Annotations[ftv1.AnnotationMembers]; m != "" {
		rec.members = strings.Split(m, ",")
	}
	if t, err := time.Parse(time.RFC3339, lease.Annotations[ftv1.AnnotationLastPromotionTime]); err == nil {
		mt := metav1.NewTime(t)
		rec.lastPromotion = &mt
	}
	return rec, nil
}

// errStaleRecord: the Lease of the pair's name belongs to an earlier FaultTolerantVM.
var errStaleRecord = errors.New("the pair's Lease belongs to an earlier FaultTolerantVM of the same name")

// writeRecord makes next the pair's record by compare-and-set on the Lease read as cur: it creates
// the Lease when cur has none, and otherwise updates it at the resourceVersion read, so that a
// decision taken from a stale view fails (with a Conflict or AlreadyExists) instead of winning.
// holderNode is the node of next's holder.
func (r *FaultTolerantVMReconciler) writeRecord(ctx context.Context, ftvm *ftv1.FaultTolerantVM, cur *record, next roles.Record, holderNode string) error {
	return r.writeRecordListing(ctx, ftvm, cur, next, holderNode, cur.members)
}

// writeRecordListing is writeRecord that also lists members as the pair's (see
// ftv1.AnnotationMembers): a member is listed in the write before the one that creates it.
func (r *FaultTolerantVMReconciler) writeRecordListing(ctx context.Context, ftvm *ftv1.FaultTolerantVM, cur *record, next roles.Record, holderNode string, members []string) error {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ftvm.Namespace, Name: ftv1.RecordName(ftvm.Name)}}
	if cur.lease != nil {
		lease = cur.lease.DeepCopy()
	}
	if lease.Labels == nil {
		lease.Labels = map[string]string{}
	}
	lease.Labels[ftv1.LabelPair] = ftvm.Name
	lease.Labels[ftv1.LabelManagedBy] = ftv1.ManagedByValue
	if err := controllerutil.SetControllerReference(ftvm, lease, r.Scheme); err != nil {
		return err
	}
	identity := ""
	if next.Holder != "" {
		identity = ftv1.SideIdentity(holderNode, next.Holder)
	}
	epoch := int32(next.Epoch)
	now := metav1.NewMicroTime(r.Clock.Now())
	if cur.lease == nil || ptr.Deref(cur.lease.Spec.HolderIdentity, "") != identity || int64(ptr.Deref(cur.lease.Spec.LeaseTransitions, 0)) != next.Epoch {
		// A new holder's term starts with the write that names it; any other write of the
		// operator's renews nothing: only the member that runs the VM (or its secondary) can.
		lease.Spec.AcquireTime, lease.Spec.RenewTime = &now, &now
		delete(lease.Annotations, ftv1.AnnotationRenewedBy)
	}
	lease.Spec.HolderIdentity, lease.Spec.LeaseTransitions = &identity, &epoch
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[ftv1.AnnotationPromotions] = strconv.Itoa(int(next.Promotions))
	if next.LastPromoted != "" {
		lease.Annotations[ftv1.AnnotationLastPromoted] = next.LastPromoted
	}
	setOrDelete(lease.Annotations, ftv1.AnnotationOperation, next.Operation)
	setOrDelete(lease.Annotations, ftv1.AnnotationReservedNode, next.ReservedNode)
	setOrDelete(lease.Annotations, ftv1.AnnotationSuspectNodes, encodeSuspects(cur.suspects))
	setOrDelete(lease.Annotations, ftv1.AnnotationMembers, strings.Join(members, ","))
	if next.LastOrdinal > 0 {
		lease.Annotations[ftv1.AnnotationLastOrdinal] = strconv.Itoa(next.LastOrdinal)
	}
	if next.Promotions != cur.Promotions {
		lease.Annotations[ftv1.AnnotationLastPromotionTime] = r.Clock.Now().UTC().Format(time.RFC3339)
	}
	var err error
	if cur.lease == nil {
		err = r.Create(ctx, lease)
	} else {
		err = r.Update(ctx, lease) // carries the resourceVersion read: the compare-and-set
	}
	if err != nil {
		return fmt.Errorf("writing the pair's record (holder %q, epoch %d): %w", identity, next.Epoch, err)
	}
	cur.lease, cur.Record, cur.holderNode, cur.members = lease, next, holderNode, members
	cur.Exists = true
	return nil
}

// dropStaleRecord deletes a Lease of the pair's name that an earlier FaultTolerantVM left (its own
// deletion removes it, so only a force-removed finalizer leaves one): it records nothing about
// this pair.
func (r *FaultTolerantVMReconciler) dropStaleRecord(ctx context.Context, stale *record) (*record, error) {
	err := r.Delete(ctx, stale.lease, client.Preconditions{UID: &stale.lease.UID})
	if client.IgnoreNotFound(err) != nil {
		return nil, fmt.Errorf("deleting the Lease %s left by an earlier FaultTolerantVM: %w", stale.lease.Name, err)
	}
	log.FromContext(ctx).Info("deleted a Lease left by an earlier FaultTolerantVM of the same name", "lease", stale.lease.Name)
	return &record{}, nil
}

// loadRecord reads the pair's record from reader, deleting a Lease that an earlier
// FaultTolerantVM of the same name left.
func (r *FaultTolerantVMReconciler) loadRecord(ctx context.Context, reader client.Reader, ftvm *ftv1.FaultTolerantVM) (*record, error) {
	rec, err := readRecord(ctx, reader, ftvm)
	if errors.Is(err, errStaleRecord) {
		return r.dropStaleRecord(ctx, rec)
	}
	return rec, err
}

// freshRecord reads the record from the API server: the decision that changes a role is taken
// from it, never from a cache that may trail.
func (r *FaultTolerantVMReconciler) freshRecord(ctx context.Context, ftvm *ftv1.FaultTolerantVM) (*record, error) {
	return r.loadRecord(ctx, r.APIReader, ftvm)
}

// releaseRecord makes the record name no holder, at the next epoch, before the members are
// stopped (a halt) or deleted (a deletion): neither member can win it after that (a secondary
// claims the epoch it knew, which is gone, and the primary's renewal finds it moved and fences
// it), so no member goes live on copies that are about to go. It returns the record as written.
func (r *FaultTolerantVMReconciler) releaseRecord(ctx context.Context, ftvm *ftv1.FaultTolerantVM) (*record, error) {
	fresh, err := r.freshRecord(ctx, ftvm)
	if err != nil || fresh.lease == nil || fresh.Holder == "" {
		return fresh, err
	}
	next := fresh.Record
	next.Holder, next.Epoch = "", fresh.Epoch+1
	return fresh, r.writeRecord(ctx, ftvm, fresh, next, "")
}

// movedTo says whether the record changed hands or epoch between r, as a view saw it, and fresh:
// a decision taken from r's view may not act on fresh.
func (r *record) movedTo(fresh *record) bool {
	return fresh.Holder != r.Holder || fresh.Epoch != r.Epoch
}

// recordNewMember records, before the member nm is created on node, that its ordinal is handed
// out (see ftv1.AnnotationLastOrdinal) and that it is the pair's member on that node (see
// ftv1.AnnotationMembers). It writes only when the record does not say both already.
func (r *FaultTolerantVMReconciler) recordNewMember(ctx context.Context, s *scope, nm *newMember, node string) error {
	id := ftv1.SideIdentity(node, nm.name)
	if s.record.LastOrdinal >= nm.spec.Ordinal && slices.Contains(s.record.members, id) {
		return nil
	}
	next := s.record.Record
	next.LastOrdinal = max(next.LastOrdinal, nm.spec.Ordinal)
	return r.writeRecordListing(ctx, s.ftvm, s.record, next, s.record.holderNode, s.listing(id))
}

// listing is the record's member list with the identities add, less the members that left the
// pair: all but its primary and secondary as this reconcile sees them (a lost, fenced or dropped
// member may never be named the holder again).
func (s *scope) listing(add ...string) []string {
	keep := map[string]bool{}
	for _, m := range []*memberView{s.primary, s.secondary} {
		if m != nil {
			keep[m.vmi.Name] = true
		}
	}
	var out []string
	for _, id := range append(slices.Clone(s.record.members), add...) {
		if _, vmi := ftv1.SplitIdentity(id); (keep[vmi] || slices.Contains(add, id)) && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// setOrDelete sets annotation key to value, or removes it when value is "".
func setOrDelete(annotations map[string]string, key, value string) {
	if value == "" {
		delete(annotations, key)
		return
	}
	annotations[key] = value
}
