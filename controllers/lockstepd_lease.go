package controllers

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/health"
)

// lockstepdOn says whether lockstepd runs on node (health.Lockstepd), from its node lease in the
// cache (lockstepd's namespace), and when the lease ran out.
func lockstepdOn(ctx context.Context, reader client.Reader, sightings *Sightings, namespace string, node *corev1.Node, now time.Time) (bool, time.Time) {
	if node == nil {
		return false, time.Time{}
	}
	lease := &coordinationv1.Lease{}
	err := reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: ftv1.NodeLeaseName(node.Name)}, lease)
	switch {
	case apierrors.IsNotFound(err):
		lease = nil // a lockstepd from before the lease: its address alone says
	case err != nil:
		// The cache cannot say (it is starting): judge by the address, as without a lease, rather
		// than take every member's lockstepd for gone.
		log.FromContext(ctx).V(1).Info("reading a node lease", "node", node.Name, "err", err.Error())
		lease = nil
	}
	return health.Lockstepd(node, lease, nodeLeaseSeen(sightings, lease, now), now)
}

// nodeLeaseSeen is when the operator first saw lease's current renewal (zero without a lease).
func nodeLeaseSeen(sightings *Sightings, lease *coordinationv1.Lease, now time.Time) time.Time {
	if lease == nil {
		return time.Time{}
	}
	return sightings.Seen("lease/"+lease.Namespace+"/"+lease.Name, health.LeaseRenewal(lease), now)
}
