package controllers

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/health"
)

// lockstepdOn says whether lockstepd runs on node (health.Lockstepd), from its node lease in the
// cache (lockstepd's namespace), and when the lease ran out.
func lockstepdOn(ctx context.Context, reader client.Reader, namespace string, node *corev1.Node, now time.Time) (bool, time.Time) {
	if node == nil {
		return false, time.Time{}
	}
	lease := &coordinationv1.Lease{}
	if err := reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: ftv1.NodeLeaseName(node.Name)}, lease); err != nil {
		lease = nil // none (or not readable): the node's address alone says
	}
	return health.Lockstepd(node, lease, now)
}
