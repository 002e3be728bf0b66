package lockstepd

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// nodeLease renews lockstepd's node lease (ftv1.NodeLeaseName) while lockstepd serves: from the
// moment its listeners are up (ready) until it stops. A renewal that fails is logged and tried
// again at the next tick; the lease then expires on its own, which is what it is for.
type nodeLease struct {
	Client          client.Client
	Namespace, Node string
	Ready           <-chan struct{}
	Every           time.Duration
}

// Start implements manager.Runnable.
func (l *nodeLease) Start(ctx context.Context) error {
	select {
	case <-l.Ready:
	case <-ctx.Done():
		return nil
	}
	t := time.NewTicker(l.Every)
	defer t.Stop()
	for {
		if err := l.renew(ctx); err != nil && ctx.Err() == nil {
			log.FromContext(ctx).Error(err, "renewing the node lease; retrying", "lease", l.Namespace+"/"+ftv1.NodeLeaseName(l.Node))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// renew creates the lease, or moves its renewTime to now.
func (l *nodeLease) renew(ctx context.Context) error {
	now := metav1.NewMicroTime(time.Now())
	holder := ftv1.SideIdentity(l.Node, ftv1.NodeLeaseHolderSuffix)
	lease := &coordinationv1.Lease{}
	err := l.Client.Get(ctx, types.NamespacedName{Namespace: l.Namespace, Name: ftv1.NodeLeaseName(l.Node)}, lease)
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: l.Namespace, Name: ftv1.NodeLeaseName(l.Node), Labels: map[string]string{
				ftv1.LabelManagedBy: ftv1.ManagedByValue, ftv1.LabelComponent: ftv1.ComponentLockstepd}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: ptr.To(int32(ftv1.NodeLeaseDurationSeconds)),
				AcquireTime: &now, RenewTime: &now},
		}
		return l.Client.Create(ctx, lease)
	}
	if err != nil {
		return err
	}
	lease.Spec.HolderIdentity, lease.Spec.LeaseDurationSeconds, lease.Spec.RenewTime = &holder, ptr.To(int32(ftv1.NodeLeaseDurationSeconds)), &now
	return l.Client.Update(ctx, lease)
}
