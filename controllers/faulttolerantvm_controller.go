// Package controllers holds the FaultTolerantVM reconciler: it keeps a primary and a secondary
// VMI of every FaultTolerantVM running on two different nodes, promotes the secondary when the
// primary is lost, and starts a new secondary when one is missing.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	virtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/health"
	"github.com/lockstep-dev/lockstep/internal/member"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/placement"
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
}

// FaultTolerantVMReconciler reconciles FaultTolerantVMs.
type FaultTolerantVMReconciler struct {
	client.Client
	// APIReader reads what the cache does not hold: the user's claims.
	APIReader client.Reader
	Scheme    *runtime.Scheme
	Recorder  events.EventRecorder
	Clock     clock.PassiveClock
	Placer    *Placer
	Config    Config

	// announced remembers the condition transitions already announced by an event, so that a
	// reconcile that reads a status older than its own last patch does not announce them twice.
	announced announcements
}

// +kubebuilder:rbac:groups=ft.lockstep.dev,resources=faulttolerantvms,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=ft.lockstep.dev,resources=faulttolerantvms/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=ft.lockstep.dev,resources=faulttolerantvms/finalizers,verbs=update
// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachineinstances,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=k8s.cni.cncf.io,resources=network-attachment-definitions,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// memberView is one member as observed.
type memberView struct {
	vmi     *virtv1.VirtualMachineInstance
	ordinal int
	node    string
	verdict health.Verdict
}

// scope carries one reconcile's observations and decisions to the status computation.
type scope struct {
	ftvm      *ftv1.FaultTolerantVM
	primary   *memberView
	secondary *memberView
	// maxOrdinal is the highest ordinal seen, so that new members get new names.
	maxOrdinal int

	invalid        error  // the spec cannot be protected
	networkMissing string // why the logging network is not there
	primaryErr     error  // why no primary could be started
	secondaryErr   error  // why no secondary could be started
	promoted       bool   // a secondary was promoted in this reconcile
	requeueAfter   time.Duration
}

func (s *scope) requeueWithin(d time.Duration) {
	if d > 0 && (s.requeueAfter == 0 || d < s.requeueAfter) {
		s.requeueAfter = d
	}
}

// Reconcile runs the phases of one FaultTolerantVM and then writes its status.
func (r *FaultTolerantVMReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	ftvm := &ftv1.FaultTolerantVM{}
	if err := r.Get(ctx, req.NamespacedName, ftvm); err != nil {
		if apierrors.IsNotFound(err) {
			metrics.Forget(req.Namespace, req.Name)
			r.announced.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
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
		if err := r.Status().Patch(ctx, ftvm, client.MergeFrom(base)); err != nil && !apierrors.IsNotFound(err) {
			retErr = errors.Join(retErr, err)
		}
		metrics.Observe(ftvm)
		if retErr == nil && s.requeueAfter > 0 {
			res.RequeueAfter = s.requeueAfter
		}
	}()

	phases := []func(context.Context, *scope) error{
		r.phaseValidate,
		r.phaseHalt,
		r.phaseLoggingNetwork,
		r.phaseMarkSynced,
		r.phaseFailover,
		r.phaseReplaceLostSecondary,
		r.phaseEnsurePrimary,
		r.phaseEnsureSecondary,
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

// observe reads the members of the pair and judges each.
func (r *FaultTolerantVMReconciler) observe(ctx context.Context, ftvm *ftv1.FaultTolerantVM) (*scope, error) {
	s := &scope{ftvm: ftvm}
	var vmis virtv1.VirtualMachineInstanceList
	if err := r.List(ctx, &vmis, client.InNamespace(ftvm.Namespace), client.MatchingFields{indexMemberByPair: ftvm.Name}); err != nil {
		return nil, err
	}
	views := make([]*memberView, 0, len(vmis.Items))
	for i := range vmis.Items {
		v := &vmis.Items[i]
		if !metav1.IsControlledBy(v, ftvm) {
			continue
		}
		mv := &memberView{vmi: v, node: v.Labels[ftv1.LabelNode]}
		mv.ordinal, _ = strconv.Atoi(v.Annotations[ftv1.AnnotationOrdinal])
		var node corev1.Node
		nodePtr := &node
		if err := r.Get(ctx, types.NamespacedName{Name: mv.node}, &node); apierrors.IsNotFound(err) {
			nodePtr = nil
		} else if err != nil {
			return nil, err
		}
		mv.verdict = health.Judge(v, mv.node, nodePtr, r.Clock.Now(), r.Config.NodeLostGrace)
		if mv.verdict.State == health.Suspect {
			s.requeueWithin(mv.verdict.RecheckAfter)
		}
		s.maxOrdinal = max(s.maxOrdinal, mv.ordinal)
		if v.DeletionTimestamp != nil {
			continue // going away: it has no role any more, but its name stays taken
		}
		views = append(views, mv)
	}
	copies, err := r.diskCopies(ctx, ftvm)
	if err != nil {
		return nil, err
	}
	for i := range copies {
		o, _ := strconv.Atoi(copies[i].Annotations[ftv1.AnnotationOrdinal])
		s.maxOrdinal = max(s.maxOrdinal, o)
	}
	sort.Slice(views, func(i, j int) bool { return views[i].ordinal < views[j].ordinal })
	for _, mv := range views {
		switch mv.vmi.Labels[ftv1.LabelRole] {
		case ftv1.RolePrimary:
			if s.primary == nil {
				s.primary = mv
				continue
			}
		case ftv1.RoleSecondary:
			if s.secondary == nil {
				s.secondary = mv
				continue
			}
		}
		// A third member should not exist; if it does, it is left alone unless it is lost.
		log.FromContext(ctx).Info("unexpected member of the pair", "vmi", mv.vmi.Name, "role", mv.vmi.Labels[ftv1.LabelRole])
		if mv.verdict.State == health.Lost {
			if err := r.deleteMember(ctx, mv, "surplus member is lost"); err != nil {
				return nil, err
			}
		}
	}
	s.judgeReplication()
	return s, nil
}

// judgeReplication applies lockstepd's reports: it sees a lost peer long before the node
// lifecycle does, and a secondary that went live holds the Lease, so its primary is lost at once.
func (s *scope) judgeReplication() {
	name := func(mv *memberView) string {
		if mv == nil {
			return ""
		}
		return mv.vmi.Name
	}
	p, sec := health.FromReplication(s.ftvm.Status.Replication, name(s.primary), name(s.secondary))
	if p != nil {
		s.primary.verdict = *p
	}
	if sec != nil {
		s.secondary.verdict = *sec
	}
}

// phaseValidate records whether the spec can be protected. An invalid spec only stops new pairs:
// members that run keep running.
func (r *FaultTolerantVMReconciler) phaseValidate(_ context.Context, s *scope) error {
	if errs := validation.Validate(s.ftvm); len(errs) > 0 {
		s.invalid = errs.ToAggregate()
	}
	return nil
}

// phaseHalt stops both members when the run strategy is Halted.
func (r *FaultTolerantVMReconciler) phaseHalt(ctx context.Context, s *scope) error {
	if s.ftvm.Spec.RunStrategy != ftv1.RunStrategyHalted {
		return nil
	}
	for _, mv := range []*memberView{s.primary, s.secondary} {
		if mv != nil && mv.vmi.DeletionTimestamp == nil {
			if err := r.deleteMember(ctx, mv, "runStrategy is Halted"); err != nil {
				return err
			}
		}
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

// phaseFailover handles a lost primary. A running secondary is promoted: it is the VM from now
// on. Without one the VM cannot go on where it was; it restarts from the lost primary's disks.
// phaseMarkSynced marks a secondary that holds the primary's state. A secondary that started
// while its primary's node was already failing never received that state, and promoting it would
// lose the VM's memory and recent writes (a restart from disk is the honest outcome then). Until
// lockstepd reports the end of the initial synchronization, a secondary counts as synchronized once
// it has run beside a primary that runs on a healthy node.
func (r *FaultTolerantVMReconciler) phaseMarkSynced(ctx context.Context, s *scope) error {
	sec, p := s.secondary, s.primary
	if sec == nil || p == nil || sec.synced() || sec.verdict.State != health.Running || p.verdict.State != health.Running {
		return nil
	}
	base := sec.vmi.DeepCopy()
	if sec.vmi.Annotations == nil {
		sec.vmi.Annotations = map[string]string{}
	}
	sec.vmi.Annotations[ftv1.AnnotationSyncedAt] = r.Clock.Now().UTC().Format(time.RFC3339)
	if err := r.Patch(ctx, sec.vmi, client.MergeFrom(base)); err != nil {
		return client.IgnoreNotFound(err)
	}
	return nil
}

// synced says whether the member holds its pair's state (see phaseMarkSynced).
func (mv *memberView) synced() bool {
	_, ok := mv.vmi.Annotations[ftv1.AnnotationSyncedAt]
	return ok
}

func (r *FaultTolerantVMReconciler) phaseFailover(ctx context.Context, s *scope) error {
	p := s.primary
	if p == nil || p.verdict.State != health.Lost {
		return nil
	}
	sec := s.secondary
	if sec != nil && sec.verdict.State == health.Running && sec.synced() {
		if err := r.promote(ctx, sec); err != nil {
			return err
		}
		if err := r.markPrimaryDisks(ctx, sec.vmi); err != nil {
			return err
		}
		r.Recorder.Eventf(s.ftvm, sec.vmi, corev1.EventTypeWarning, ftv1.ReasonPromoted, "Failover",
			"primary %s on node %s lost (%s): secondary %s on node %s promoted", p.vmi.Name, p.node, p.verdict.Message, sec.vmi.Name, sec.node)
		now := metav1.NewTime(r.Clock.Now())
		s.ftvm.Status.FailoverCount++
		s.ftvm.Status.LastFailoverTime = &now
		metrics.Failovers.WithLabelValues(s.ftvm.Namespace, s.ftvm.Name).Inc()
		s.promoted = true
		s.primary, s.secondary = sec, nil
		return r.deleteMember(ctx, p, "primary lost: "+p.verdict.Reason)
	}
	// No running secondary holds the VM's state: restart the VM elsewhere from the primary's
	// disks (phaseEnsurePrimary starts it). A secondary that never synchronized holds nothing
	// worth keeping.
	why := "no secondary"
	if sec != nil {
		why = fmt.Sprintf("secondary %s never synchronized", sec.vmi.Name)
	}
	r.Recorder.Eventf(s.ftvm, p.vmi, corev1.EventTypeWarning, ftv1.ReasonPrimaryLost, "Restart",
		"primary %s on node %s lost (%s) with %s: the VM restarts from the primary's disks", p.vmi.Name, p.node, p.verdict.Message, why)
	if sec != nil {
		if err := r.deleteMember(ctx, sec, "its primary was lost before it ran"); err != nil {
			return err
		}
		s.secondary = nil
	}
	if err := r.deleteMember(ctx, p, "primary lost: "+p.verdict.Reason); err != nil {
		return err
	}
	s.primary = nil
	return nil
}

// promote makes the secondary the primary.
func (r *FaultTolerantVMReconciler) promote(ctx context.Context, sec *memberView) error {
	base := sec.vmi.DeepCopy()
	sec.vmi.Labels[ftv1.LabelRole] = ftv1.RolePrimary
	sec.vmi.Annotations[ftv1.AnnotationRoleSince] = r.Clock.Now().UTC().Format(time.RFC3339)
	// The optimistic lock makes a promotion from a stale view fail rather than win.
	if err := r.Patch(ctx, sec.vmi, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("promoting %s: %w", sec.vmi.Name, err)
	}
	log.FromContext(ctx).Info("promoted secondary", "vmi", sec.vmi.Name, "node", sec.node)
	return nil
}

// phaseReplaceLostSecondary removes a lost secondary, so that a new one is started.
func (r *FaultTolerantVMReconciler) phaseReplaceLostSecondary(ctx context.Context, s *scope) error {
	sec := s.secondary
	if sec == nil || sec.verdict.State != health.Lost {
		return nil
	}
	r.Recorder.Eventf(s.ftvm, sec.vmi, corev1.EventTypeWarning, ftv1.ReasonSecondaryLost, "Replace",
		"secondary %s on node %s lost (%s): starting a new secondary", sec.vmi.Name, sec.node, sec.verdict.Message)
	if err := r.deleteMember(ctx, sec, "secondary lost: "+sec.verdict.Reason); err != nil {
		return err
	}
	s.secondary = nil
	return nil
}

// canStartMembers says whether new members may be started from this spec.
func (s *scope) canStartMembers() bool {
	return s.invalid == nil && s.networkMissing == ""
}

// phaseEnsurePrimary starts a new (or restarted) pair: both members in one placement decision,
// so that pairs starting together fill nodes with whole pairs rather than lone primaries.
func (r *FaultTolerantVMReconciler) phaseEnsurePrimary(ctx context.Context, s *scope) error {
	if s.primary != nil || !s.canStartMembers() {
		return nil
	}
	tmpl := member.Normalize(s.ftvm.UID, s.ftvm.Spec.Template)
	if s.secondary != nil {
		// Only a primary deleted by hand leaves a secondary alone; start a primary beside it.
		mv, err := r.startMember(ctx, s, tmpl, ftv1.RolePrimary, s.secondary)
		if err != nil {
			return r.recordPlacementError(s, &s.primaryErr, err)
		}
		s.primary = mv
		return nil
	}
	return r.startPair(ctx, s, tmpl)
}

// phaseEnsureSecondary starts a secondary for a primary that has none, from the template the
// primary runs.
func (r *FaultTolerantVMReconciler) phaseEnsureSecondary(ctx context.Context, s *scope) error {
	// After phaseFailover a primary is never Lost: it was replaced or cleared.
	if s.primary == nil || s.secondary != nil || s.secondaryErr != nil {
		return nil
	}
	if s.networkMissing != "" {
		return nil
	}
	tmpl, err := member.DecodeTemplate(s.primary.vmi)
	if err != nil {
		// Only a member edited by hand lacks it; the FaultTolerantVM's template is the best guess.
		log.FromContext(ctx).Error(err, "building the secondary from the FaultTolerantVM's template")
		tmpl = member.Normalize(s.ftvm.UID, s.ftvm.Spec.Template)
	}
	mv, err := r.startMember(ctx, s, tmpl, ftv1.RoleSecondary, s.primary)
	if err != nil {
		return r.recordPlacementError(s, &s.secondaryErr, err)
	}
	s.secondary = mv
	return nil
}

// recordPlacementError keeps a placement failure for the status and retries later; other errors
// are returned.
func (r *FaultTolerantVMReconciler) recordPlacementError(s *scope, into *error, err error) error {
	if errors.Is(err, placement.ErrNoEligibleNode) || errors.Is(err, errSourceClaim) {
		*into = err
		s.requeueWithin(r.Config.RetryInterval)
		return nil
	}
	return err
}

// newMember is a member about to be placed and created.
type newMember struct {
	name string
	tmpl ftv1.VMITemplate
	spec member.Member
	req  placement.Request
	vmi  *virtv1.VirtualMachineInstance // set once created
}

func (r *FaultTolerantVMReconciler) prepareMember(s *scope, tmpl ftv1.VMITemplate, role string, ordinal int) *newMember {
	ftvm := s.ftvm
	m := member.Member{Ordinal: ordinal, Role: role, Since: r.Clock.Now(), LogBandwidthMbps: r.logBandwidthMbps(ftvm)}
	return &newMember{
		name: member.Name(ftvm.Name, ordinal),
		tmpl: tmpl,
		spec: m,
		req: placement.Request{Pair: pairKey(ftvm.Namespace, ftvm.Name), Role: placement.Role(role),
			VCPUs: member.VCPUs(&tmpl.Spec), LogBandwidthMbps: m.LogBandwidthMbps},
	}
}

func (nm *newMember) key(s *scope) types.NamespacedName {
	return types.NamespacedName{Namespace: s.ftvm.Namespace, Name: nm.name}
}

// create creates the member (and its disk copies) on node; the Placer calls it.
func (r *FaultTolerantVMReconciler) create(ctx context.Context, s *scope, nm *newMember, node string) error {
	nm.spec.Node = node
	claims, err := r.ensureMemberClaims(ctx, s.ftvm, &nm.tmpl.Spec, nm.name, nm.spec.Ordinal, nm.spec.Role)
	if err != nil {
		return err
	}
	nm.spec.Claims = claims
	vmi, err := member.Build(s.ftvm, nm.tmpl, nm.spec, r.Config.Member)
	if err != nil {
		return err
	}
	if err := controllerutil.SetControllerReference(s.ftvm, vmi, r.Scheme); err != nil {
		return err
	}
	if err := r.Create(ctx, vmi); err != nil {
		return err
	}
	nm.vmi = vmi
	return nil
}

// created records a created member in the scope, the log and the events.
func (r *FaultTolerantVMReconciler) created(ctx context.Context, s *scope, nm *newMember) *memberView {
	s.maxOrdinal = max(s.maxOrdinal, nm.spec.Ordinal)
	r.Recorder.Eventf(s.ftvm, nm.vmi, corev1.EventTypeNormal, "MemberCreated", "Create", "%s %s placed on node %s", nm.spec.Role, nm.name, nm.spec.Node)
	log.FromContext(ctx).Info("created member", "vmi", nm.name, "role", nm.spec.Role, "node", nm.spec.Node)
	return &memberView{vmi: nm.vmi, ordinal: nm.spec.Ordinal, node: nm.spec.Node, verdict: health.Verdict{State: health.Pending, Reason: string(virtv1.Pending)}}
}

// startPair places and creates both members of a new pair; when only the primary fits, it starts
// alone and the status says why it is not protected.
func (r *FaultTolerantVMReconciler) startPair(ctx context.Context, s *scope, tmpl ftv1.VMITemplate) error {
	p := r.prepareMember(s, tmpl, ftv1.RolePrimary, s.maxOrdinal+1)
	sec := r.prepareMember(s, tmpl, ftv1.RoleSecondary, s.maxOrdinal+2)
	pp, err := r.Placer.PlaceAndCreatePair(ctx, p.req, sec.req, &tmpl.Spec, s.ftvm.Spec.TopologyKey, p.key(s), sec.key(s),
		func(node string) error { return r.create(ctx, s, p, node) },
		func(node string) error { return r.create(ctx, s, sec, node) })
	if pp.Primary != "" {
		s.primary = r.created(ctx, s, p)
	}
	if pp.Secondary != "" {
		s.secondary = r.created(ctx, s, sec)
	} else if pp.SecondaryErr != nil {
		_ = r.recordPlacementError(s, &s.secondaryErr, pp.SecondaryErr) // a NoEligibleNodeError
	}
	switch {
	case apierrors.IsAlreadyExists(err):
		// The cache trails our own earlier create; the next reconcile sees the member.
		s.requeueWithin(time.Second)
		return errStop
	case err != nil && pp.Primary == "":
		return r.recordPlacementError(s, &s.primaryErr, err)
	default:
		return err
	}
}

// startMember places one new member and creates it (and its disk copies), away from its partner.
func (r *FaultTolerantVMReconciler) startMember(ctx context.Context, s *scope, tmpl ftv1.VMITemplate, role string, partner *memberView) (*memberView, error) {
	nm := r.prepareMember(s, tmpl, role, s.maxOrdinal+1)
	if partner != nil {
		nm.req.AvoidNodes = []string{partner.node}
		if key := s.ftvm.Spec.TopologyKey; key != "" {
			var pn corev1.Node
			if err := r.Get(ctx, types.NamespacedName{Name: partner.node}, &pn); err != nil {
				return nil, err
			}
			nm.req.AvoidDomains = []string{pn.Labels[key]}
		}
	}
	_, err := r.Placer.PlaceAndCreate(ctx, nm.req, &tmpl.Spec, s.ftvm.Spec.TopologyKey, nm.key(s), func(node string) error {
		return r.create(ctx, s, nm, node)
	})
	if apierrors.IsAlreadyExists(err) {
		// The cache trails our own earlier create; the next reconcile sees the member.
		s.requeueWithin(time.Second)
		return nil, errStop
	}
	if err != nil {
		return nil, err
	}
	return r.created(ctx, s, nm), nil
}

// logBandwidthMbps is the logging bandwidth reserved for the VM (paper 2.10).
func (r *FaultTolerantVMReconciler) logBandwidthMbps(ftvm *ftv1.FaultTolerantVM) int {
	if l := ftvm.Spec.ExpectedLoad; l != nil {
		return placement.LogBandwidthMbps(int(l.DiskReadMBps), int(l.NetworkReceiveMbps))
	}
	return r.Config.DefaultLogBandwidthMbps
}

// deleteMember deletes a member VMI; a member already gone is fine.
func (r *FaultTolerantVMReconciler) deleteMember(ctx context.Context, mv *memberView, why string) error {
	if mv.vmi.DeletionTimestamp != nil {
		return nil
	}
	// Preconditions: delete exactly the member that was judged, not a newer one of the same name.
	err := r.Delete(ctx, mv.vmi, client.Preconditions{UID: &mv.vmi.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting member %s: %w", mv.vmi.Name, err)
	}
	log.FromContext(ctx).Info("deleted member", "vmi", mv.vmi.Name, "node", mv.node, "why", why)
	return nil
}

// reconcileDelete deletes the members, waits for them to go, then releases the finalizer.
func (r *FaultTolerantVMReconciler) reconcileDelete(ctx context.Context, ftvm *ftv1.FaultTolerantVM) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(ftvm, ftv1.Finalizer) {
		return ctrl.Result{}, nil
	}
	// Read the API server, not the cache: a member created just before the deletion may not be
	// in the cache yet, and the finalizer must not go while a member exists.
	var vmis virtv1.VirtualMachineInstanceList
	if err := r.APIReader.List(ctx, &vmis, client.InNamespace(ftvm.Namespace), client.MatchingLabels{ftv1.LabelPair: ftvm.Name}); err != nil {
		return ctrl.Result{}, err
	}
	remaining := 0
	for i := range vmis.Items {
		v := &vmis.Items[i]
		if !metav1.IsControlledBy(v, ftvm) {
			continue
		}
		remaining++
		if err := r.deleteMember(ctx, &memberView{vmi: v, node: v.Labels[ftv1.LabelNode]}, "FaultTolerantVM deleted"); err != nil {
			return ctrl.Result{}, err
		}
	}
	if remaining > 0 {
		// VMI deletions wake us; the requeue covers a member stuck on a lost node.
		return ctrl.Result{RequeueAfter: r.Config.RetryInterval}, nil
	}
	base := ftvm.DeepCopy()
	controllerutil.RemoveFinalizer(ftvm, ftv1.Finalizer)
	if err := r.Patch(ctx, ftvm, client.MergeFrom(base)); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	metrics.Forget(ftvm.Namespace, ftvm.Name)
	return ctrl.Result{}, nil
}

// SetupWithManager registers the controller and its watches.
func (r *FaultTolerantVMReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&ftv1.FaultTolerantVM{}).
		Owns(&virtv1.VirtualMachineInstance{}).
		Watches(&virtv1.VirtualMachineInstance{}, r.capacityFreedHandler(), builderPredicatesMemberGone()).
		Watches(&corev1.Node{}, r.nodeHandler(), builderPredicatesNodeChanged()).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.Config.MaxConcurrentReconciles, 1)}).
		Named("faulttolerantvm").
		Complete(r)
}
