// Package arbiter decides which side of a pair may be live, with a compare-and-set on the pair's
// coordination.k8s.io Lease: the white paper's atomic test-and-set on shared storage (1.4). When
// the secondary stops hearing the primary it claims the Lease to go live; a primary that stops
// hearing its secondary claims the same Lease to go on alone. Both claim the epoch they last
// knew, so exactly one wins; the other has lost and must never release output again (it fences
// itself: drops what its gate holds and stops its VM). A side that cannot reach the API server
// cannot win either, and fences itself too: with no arbiter, nobody goes live alone.
//
// The epoch is the Lease's leaseTransitions. It also fences the channel: a secondary refuses a
// primary of an older epoch.
package arbiter

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/term"
)

// ErrLost means another side holds a newer epoch: this side must fence itself.
var ErrLost = engine.ErrLost

// Arbiter claims one pair's Lease for one side.
type Arbiter struct {
	Client client.Client
	// Lease is the pair's Lease.
	Lease types.NamespacedName
	// Identity names this side ("<node>/<vmi>").
	Identity string
	// Timeout bounds one claim; past it the API server counts as unreachable.
	Timeout time.Duration
	// Term is the record's term that this side's claims and renewals write (internal/term).
	Term term.Term
}

// Holder is who holds the Lease, at which epoch.
type Holder = engine.Holder

var _ engine.Arbiter = (*Arbiter)(nil)

// Ensure creates the Lease with identity as holder at epoch 1 if it does not exist, and returns the
// current holder.
func (a *Arbiter) Ensure(ctx context.Context) (Holder, error) {
	ctx, cancel := a.bound(ctx)
	defer cancel()
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: a.Lease.Namespace, Name: a.Lease.Name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &a.Identity, LeaseTransitions: new(int32(1)),
			AcquireTime: &now},
	}
	a.stamp(lease, now)
	err := a.Client.Create(ctx, lease)
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return Holder{}, err
	}
	return a.Current(ctx)
}

// Current reads the holder.
func (a *Arbiter) Current(ctx context.Context) (Holder, error) {
	ctx, cancel := a.bound(ctx)
	defer cancel()
	lease := &coordinationv1.Lease{}
	if err := a.Client.Get(ctx, a.Lease, lease); err != nil {
		return Holder{}, err
	}
	return a.holderOf(lease), nil
}

func (a *Arbiter) holderOf(l *coordinationv1.Lease) Holder {
	h := Holder{}
	if l.Spec.HolderIdentity != nil {
		h.Identity = *l.Spec.HolderIdentity
	}
	if l.Spec.LeaseTransitions != nil {
		h.Epoch = uint64(*l.Spec.LeaseTransitions)
	}
	h.Self = names(h.Identity, a.Identity)
	return h
}

// names says whether the record's holder identity names the side self ("<node>/<vmi>"): the same
// member, on the same node when the holder names one (the operator may name a member before its
// node is known). A holder that names this member on another node does not name this side: only
// lockstepd on a member's node writes that member into the record, and another node's that
// wrote it so would otherwise make this side take a record it never won.
func names(holder, self string) bool {
	hn, hv := ftv1.SplitIdentity(holder)
	sn, sv := ftv1.SplitIdentity(self)
	return holder != "" && hv == sv && (hn == "" || hn == sn)
}

// Claim makes this side the live one, if the Lease is still at epoch known: it returns the new
// epoch. ErrLost means the other side moved the Lease first (or this side's view is stale); any
// other error means the API server could not decide it, which the caller must treat as lost.
//
// The compare-and-set is on the Lease's resourceVersion, which every write moves, not only a
// claim: the operator keeps its own annotations on the record (the ordinals it handed out, the
// last promotion) and writes them while a side claims. So a conflict alone decides nothing: the
// claim reads the Lease again and decides again, until the write goes through or the read says
// who won. A conflict taken for a loss would fence the only live member of a pair whose
// secondary had just died, because the operator writes the record when it starts the next one.
func (a *Arbiter) Claim(ctx context.Context, known uint64) (uint64, error) {
	ctx, cancel := a.bound(ctx)
	defer cancel()
	for {
		lease := &coordinationv1.Lease{}
		if err := a.Client.Get(ctx, a.Lease, lease); err != nil {
			return 0, err
		}
		// The other side's claim, or an earlier try of this one whose answer was lost, shows
		// here as a newer epoch: lost, or already won.
		epoch, write, err := engine.DecideClaim(a.holderOf(lease), a.Identity, known)
		if !write {
			return epoch, err
		}
		now := metav1.NewMicroTime(time.Now())
		next := int32(epoch)
		lease.Spec.HolderIdentity, lease.Spec.LeaseTransitions = &a.Identity, &next
		lease.Spec.AcquireTime = &now
		a.stamp(lease, now)
		// Update carries the resourceVersion read above: the API server's compare-and-set.
		err = a.Client.Update(ctx, lease)
		if apierrors.IsConflict(err) {
			continue // written since the read: decide again on what is there now
		}
		if err != nil {
			return 0, err
		}
		return uint64(next), nil
	}
}

// Renew renews the record's term while it names member at epoch (engine.Arbiter). Like a claim,
// it decides again on a conflict: the other member renews the same record.
func (a *Arbiter) Renew(ctx context.Context, epoch uint64, member string) error {
	ctx, cancel := a.bound(ctx)
	defer cancel()
	for {
		lease := &coordinationv1.Lease{}
		if err := a.Client.Get(ctx, a.Lease, lease); err != nil {
			return err
		}
		h := a.holderOf(lease)
		if err := engine.RenewDecision(h, ftv1.VMIOfIdentity(h.Identity), member, epoch); err != nil {
			return err
		}
		a.stamp(lease, metav1.NewMicroTime(time.Now()))
		err := a.Client.Update(ctx, lease) // at the resourceVersion read: the compare-and-set
		if apierrors.IsConflict(err) {
			continue
		}
		return err
	}
}

// stamp writes a renewal by this side at now: the renew time, the term and who renewed.
func (a *Arbiter) stamp(lease *coordinationv1.Lease, now metav1.MicroTime) {
	lease.Spec.RenewTime = &now
	if a.Term > 0 {
		lease.Spec.LeaseDurationSeconds = new(a.Term.Seconds())
	}
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[ftv1.AnnotationRenewedBy] = a.Identity
}

func (a *Arbiter) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if a.Timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, a.Timeout)
}
