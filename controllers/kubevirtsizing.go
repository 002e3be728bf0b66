package controllers

import (
	"context"
	"runtime"

	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/lockstep-dev/lockstep/internal/kubevirtsize"
)

// +kubebuilder:rbac:groups=kubevirt.io,resources=kubevirts,verbs=get;list

// KubeVirtSizing reads what the cluster's KubeVirt CR says that sizes a launcher pod
// (kubevirtsize.Cluster: the additional overhead ratio and the network binding plugins):
// virt-controller sizes every member's launcher by it, and placement must count a member at the
// size the scheduler will. A nil KubeVirtSizing, or a cluster without a KubeVirt CR, sizes as a
// CR that sets none of it.
type KubeVirtSizing struct {
	// Reader reads the API server: once a placement decision, for an object no informer needs to
	// hold.
	Reader client.Reader
}

// Cluster is the sizing configuration now. virt-controller's architecture is taken to be the
// operator's own (they run on the control plane's nodes alike); a VMI that names one is sized by it.
func (k *KubeVirtSizing) Cluster(ctx context.Context) kubevirtsize.Cluster {
	if k == nil || k.Reader == nil {
		return kubevirtsize.ClusterOf(nil, runtime.GOARCH)
	}
	var list virtv1.KubeVirtList
	if err := k.Reader.List(ctx, &list); err != nil {
		log.FromContext(ctx).Info("cannot read the KubeVirt CR: launchers are sized as KubeVirt's defaults size them", "err", err.Error())
		return kubevirtsize.ClusterOf(nil, runtime.GOARCH)
	}
	return kubevirtsize.ClusterOfList(list.Items, runtime.GOARCH)
}
