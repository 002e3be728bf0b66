// Package controllers holds the FaultTolerantVM reconciler: it keeps a primary and a secondary
// VMI of every FaultTolerantVM running on two different nodes, promotes the secondary when the
// primary is lost, and starts a new secondary when one is missing.
//
// Which member runs the VM is decided once, in the pair's record (record.go), by compare-and-set,
// before anything acts on it; every later step (labels, fencing, new members, status, counts) is
// derived from the record and from what is observed, so that an operator that crashes between any
// two of its writes, and starts again with an empty cache, carries on to the same end.
package controllers

import (
	"context"
	"errors"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	virtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/member"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/validation"
)

// Config holds the operator's cluster-wide settings (flags, Helm values).
type Config struct {
	Member member.Options
	// NodeLostGrace is how long a node may be NotReady or unreachable before its members are lost.
	NodeLostGrace time.Duration
	// RetryInterval is how soon a FaultTolerantVM that waits for capacity is looked at again,
	// besides the node and VMI events that wake it up at once.
	RetryInterval time.Duration
	// DefaultLogBandwidthMbps is reserved for a VM that does not state its expected load.
	DefaultLogBandwidthMbps int
	// MaxConcurrentReconciles bounds parallel reconciles; placement is serialized by the Placer.
	MaxConcurrentReconciles int
	// Signer configures lockstepd's certificate signer (not run when ServiceAccount is empty).
	Signer SignerConfig
	// LockstepdNamespace is where lockstepd runs and renews its node leases.
	LockstepdNamespace string
}

// FaultTolerantVMReconciler reconciles FaultTolerantVMs.
type FaultTolerantVMReconciler struct {
	client.Client
	// APIReader reads the API server directly: the user's claims, and the pair's record before a
	// decision that changes a role.
	APIReader client.Reader
	Scheme    *runtime.Scheme
	Recorder  events.EventRecorder
	Clock     clock.PassiveClock
	Placer    *Placer
	Config    Config
	// Sightings is shared with the Placer (sightings.go).
	Sightings *Sightings

	// announced remembers the condition transitions already announced by an event, so that a
	// reconcile that reads a status older than its own last patch does not announce them twice.
	announced announcements
	// protectedOnce holds the FaultTolerantVMs this process saw Protected (re-protection metrics).
	protectedOnce sync.Map
}

// +kubebuilder:rbac:groups=ft.lockstep.dev,resources=faulttolerantvms,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=ft.lockstep.dev,resources=faulttolerantvms/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=ft.lockstep.dev,resources=faulttolerantvms/finalizers,verbs=update
// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachineinstances,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=k8s.cni.cncf.io,resources=network-attachment-definitions,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile runs the phases of one FaultTolerantVM and then writes its status.
func (r *FaultTolerantVMReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	ftvm := &ftv1.FaultTolerantVM{}
	if err := r.Get(ctx, req.NamespacedName, ftvm); err != nil {
		if apierrors.IsNotFound(err) {
			metrics.Forget(req.Namespace, req.Name)
			r.announced.forget(req.NamespacedName)
			r.protectedOnce.Delete(req.NamespacedName)
			r.Sightings.Forget(recordSighting(req.Namespace, ftv1.RecordName(req.Name)))
			return ctrl.Result{}, r.orphanedOperations(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, err
	}
	if !ftvm.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, ftvm)
	}
	if !controllerutil.ContainsFinalizer(ftvm, ftv1.Finalizer) {
		base := ftvm.DeepCopy()
		controllerutil.AddFinalizer(ftvm, ftv1.Finalizer)
		if err := r.Patch(ctx, ftvm, client.MergeFrom(base)); err != nil {
			return ctrl.Result{}, err
		}
	}

	s, err := r.observe(ctx, ftvm)
	if err != nil {
		return ctrl.Result{}, err
	}
	base := ftvm.DeepCopy()
	defer func() {
		r.computeStatus(s)
		r.emitTransitions(base, ftvm)
		// Status is derived: a write that would change nothing is not made.
		if !apiequality.Semantic.DeepEqual(base.Status, ftvm.Status) {
			if err := r.Status().Patch(ctx, ftvm, client.MergeFrom(base)); err != nil && !apierrors.IsNotFound(err) {
				retErr = errors.Join(retErr, err)
			}
		}
		metrics.Observe(ftvm)
		if retErr == nil && s.requeueAfter > 0 {
			res.RequeueAfter = s.requeueAfter
		}
	}()

	phases := []func(context.Context, *scope) error{
		r.phaseReleaseLostLaunchers,
		r.phaseValidate,
		r.phaseAdopt,
		r.phaseHalt,
		r.phaseLoggingNetwork,
		r.phaseDecide,
		r.phaseMarkSynced,
		r.phaseRecordReplicas,
		r.phaseLauncherRoles,
		r.phaseStartPair,
		r.phaseProtection,
		r.phaseEnsureSecondary,
		r.phaseEvacuations,
		r.phaseOperations,
		r.phaseCollectDiskCopies,
	}
	for _, phase := range phases {
		if err := phase(ctx, s); err != nil {
			if errors.Is(err, errStop) {
				return ctrl.Result{}, nil
			}
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, nil
}

// errStop ends the phases of a reconcile without an error.
var errStop = errors.New("stop")

// phaseValidate records whether the spec can be protected. An invalid spec only stops new pairs:
// members that run keep running.
func (r *FaultTolerantVMReconciler) phaseValidate(_ context.Context, s *scope) error {
	if errs := validation.Validate(s.ftvm); len(errs) > 0 {
		s.invalid = errs.ToAggregate()
	}
	return nil
}

// phaseHalt stops every member when the run strategy is Halted. The record is released first (no
// member may run the VM), then the primary is fenced and the members deleted; running again
// starts a new pair, whose primary takes the record.
func (r *FaultTolerantVMReconciler) phaseHalt(ctx context.Context, s *scope) error {
	if s.ftvm.Spec.RunStrategy != ftv1.RunStrategyHalted {
		return nil
	}
	if s.record.Holder != "" {
		fresh, err := r.releaseRecord(ctx, s.ftvm)
		if err != nil {
			return r.retryOnRace(s, err)
		}
		s.record = fresh
	}
	for _, mv := range s.members {
		if err := r.retire(ctx, s, mv, ftv1.ReasonHalted, "runStrategy is Halted"); err != nil {
			return err
		}
	}
	s.primary, s.secondary = nil, nil
	if err := r.phaseOperations(ctx, s); err != nil {
		return err
	}
	return errStop
}

// phaseLoggingNetwork makes sure the logging network exists before any member is created.
func (r *FaultTolerantVMReconciler) phaseLoggingNetwork(ctx context.Context, s *scope) error {
	missing, err := ensureLoggingNetwork(ctx, r.Client, s.ftvm)
	if err != nil {
		return err
	}
	s.networkMissing = missing
	if missing != "" {
		s.requeueWithin(r.Config.RetryInterval)
	}
	return nil
}

// canStartMembers says whether new members may be started from this spec.
func (s *scope) canStartMembers() bool {
	return s.invalid == nil && s.networkMissing == "" && s.adopting == ""
}

// SetupWithManager registers the controller and its watches. The pair's record is owned by the
// FaultTolerantVM, so a claim that lockstepd makes on it wakes the reconcile at once.
func (r *FaultTolerantVMReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&ftv1.FaultTolerantVM{}).
		Owns(&virtv1.VirtualMachineInstance{}).
		Owns(&coordinationv1.Lease{}, builderPredicatesRecordChanged()).
		Watches(&coordinationv1.Lease{}, r.renewalObserver()).
		// Its operations: a new one, or one deleted (status writes are the reconcile's own).
		Watches(&ftv1.FaultTolerantVMOperation{}, operationHandler(), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&virtv1.VirtualMachineInstance{}, r.capacityFreedHandler(), builderPredicatesMemberGone()).
		Watches(&corev1.Node{}, r.nodeHandler(), builderPredicatesNodeChanged()).
		// The VirtualMachines that FaultTolerantVMs adopt, by their metadata only (see adoption.go).
		WatchesMetadata(&virtv1.VirtualMachine{}, r.adoptedVMHandler()).
		// A member's launcher pod, to label it with the member's role as soon as KubeVirt makes
		// it, and again when someone changes that label (phaseLauncherRoles).
		Watches(&corev1.Pod{}, launcherPodHandler(), builder.WithPredicates(launcherRoleChanged())).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.Config.MaxConcurrentReconciles, 1)}).
		Named("faulttolerantvm").
		Complete(r)
}
