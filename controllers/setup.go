package controllers

import (
	"context"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"
	virtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/nodecert"
	"github.com/lockstep-dev/lockstep/internal/placement"
	"github.com/lockstep-dev/lockstep/internal/scheme"
)

// NewScheme knows every type the operator reads or writes (internal/scheme).
func NewScheme() *runtime.Scheme { return scheme.New() }

// CacheOptions keeps only lockstep's own VMIs, claims, launcher pods and Leases in memory: a cluster may run many VMs
// that are not fault tolerant. Other claims (the user's) are read through the API reader.
func CacheOptions() cache.Options {
	managed := labels.SelectorFromSet(labels.Set{ftv1.LabelManagedBy: ftv1.ManagedByValue})
	return cache.Options{
		// The operator never reads managedFields; without them its peak memory at 1,000 VMs fell
		// from 308 to 256 MiB (make bench-scale).
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&virtv1.VirtualMachineInstance{}: {Label: managed},
			&corev1.PersistentVolumeClaim{}:  {Label: managed},
			// The members' launcher pods (KubeVirt copies the members' labels to them).
			&corev1.Pod{}: {Label: managed},
			// The pairs' records and lockstepd's node leases, not the kubelets'.
			&coordinationv1.Lease{}: {Label: managed},
			// lockstepd's certificate requests, not the kubelets'.
			&certificatesv1.CertificateSigningRequest{}: {Field: fields.OneTermEqualSelector("spec.signerName", nodecert.SignerName)},
		}}
}

// Setup registers the indexes and the FaultTolerantVM reconciler with a manager.
func Setup(ctx context.Context, mgr ctrl.Manager, cfg Config, limits placement.Limits) error {
	if err := SetupIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	nodes, err := InformerLister(ctx, mgr.GetCache(), &corev1.Node{})
	if err != nil {
		return err
	}
	members, err := InformerLister(ctx, mgr.GetCache(), &virtv1.VirtualMachineInstance{})
	if err != nil {
		return err
	}
	podCache, err := NewNodeRequestsCache(mgr)
	if err != nil {
		return err
	}
	pods, err := podCache.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return err
	}
	requests, err := NewNodeRequests(pods)
	if err != nil {
		return err
	}
	var leases Store
	if cfg.Member.COLO.Enabled {
		if leases, err = InformerLister(ctx, mgr.GetCache(), &coordinationv1.Lease{}); err != nil {
			return err
		}
	}
	sightings := &Sightings{}
	r := &FaultTolerantVMReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Scheme:    mgr.GetScheme(),
		Recorder:  mgr.GetEventRecorder("lockstep-operator"),
		Clock:     clock.RealClock{},
		Placer: &Placer{Nodes: nodes, Members: members, Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
			Defaults: limits, AssumeTTL: 2 * time.Minute, RequireLockstepd: cfg.Member.COLO.Enabled, LockstepdNamespace: cfg.LockstepdNamespace, Leases: leases,
			Requests: requests, Sightings: sightings, Sizing: &KubeVirtSizing{Reader: mgr.GetAPIReader()}},
		Config:    cfg,
		Sightings: sightings,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	if cfg.Signer.ServiceAccount == "" {
		return nil
	}
	signer := &LockstepdSigner{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Config: cfg.Signer}
	return signer.SetupWithManager(mgr)
}
