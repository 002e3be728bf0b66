package kubevirtdouble

import (
	"context"
	"runtime"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/kubevirtsize"
)

// Launcher is the local-cluster double of virt-controller's pod handling (and of the phase
// reports of virt-handler). The local cluster has a real scheduler and kwok-simulated kubelets,
// so pods exist and are really scheduled: for each VMI it creates a launcher-like pod carrying
// the VMI's labels, affinity, node selector, tolerations, priority and resources, lets the
// scheduler place it, and mirrors the pod into the VMI status as KubeVirt does:
//
//	pod unscheduled                 -> Scheduling (PodScheduled False, the scheduler's message)
//	pod bound to a node, Pending    -> Scheduled, status.nodeName
//	pod Running                     -> Running, Ready True
//	pod Succeeded / Failed          -> Succeeded / Failed
//	pod being deleted               -> Ready False, reason PodTerminating
//	pod gone after it was scheduled -> Failed, Ready False, reason PodNotExists
//
// On a lost node the pod stays as it was (no kubelet reports on it) until it is deleted, and then
// it stays terminating: the same picture real KubeVirt gives. The double boots nothing.
type Launcher struct {
	client.Client
	// Image is the launcher container's image; kwok never pulls it.
	Image string
	// Domains, when set, boots member VMIs on their nodes' hosts (the local cluster's full
	// stack), and a member's phase follows its domain rather than its pod.
	Domains *Domains
	// VMIWriter, when set, writes VMIs instead of Client: as one of KubeVirt's own ServiceAccounts,
	// which alone virt-api's VMI mutator lets change a VMI's status (for anyone else it puts the
	// old status back).
	VMIWriter client.Client
}

// Labels of launcher pods, as KubeVirt sets them.
const (
	LabelApp       = "kubevirt.io"
	LabelCreatedBy = "kubevirt.io/created-by"
	launcherApp    = "virt-launcher"
)

// launcherLabels are a VMI's launcher pod's labels: the VMI's own, as virt-controller copies them,
// and KubeVirt's.
func launcherLabels(vmi *virtv1.VirtualMachineInstance) map[string]string {
	labels := map[string]string{}
	for k, v := range vmi.Labels {
		labels[k] = v
	}
	labels[LabelApp] = launcherApp
	labels[LabelCreatedBy] = string(vmi.UID)
	return labels
}

// LauncherPodName is the deterministic name of a VMI's launcher pod (KubeVirt generates one; a
// fixed name keeps the double idempotent without a second index).
func LauncherPodName(vmi string) string { return "virt-launcher-" + vmi }

// Reconcile creates the VMI's launcher pod and mirrors the pod into the VMI status.
func (l *Launcher) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	vmi := &virtv1.VirtualMachineInstance{}
	if err := l.Get(ctx, req.NamespacedName, vmi); err != nil {
		if apierrors.IsNotFound(err) && l.Domains != nil {
			l.Domains.Destroy(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err) // the pod goes with it (owner reference)
	}
	pod := &corev1.Pod{}
	err := l.Get(ctx, types.NamespacedName{Namespace: vmi.Namespace, Name: LauncherPodName(vmi.Name)}, pod)
	if vmi.DeletionTimestamp != nil || vmi.IsFinal() {
		if l.Domains != nil {
			l.Domains.Destroy(req.NamespacedName)
		}
		if apierrors.IsNotFound(err) || (err == nil && pod.Labels[LabelCreatedBy] != string(vmi.UID)) {
			pod = nil
		} else if err != nil {
			return ctrl.Result{}, err
		}
		return l.finish(ctx, vmi, pod)
	}
	switch {
	case apierrors.IsNotFound(err):
		if vmi.Status.NodeName != "" || vmi.Status.Phase == virtv1.Scheduled || vmi.Status.Phase == virtv1.Running {
			return l.mirror(ctx, vmi, nil) // it had a pod: PodNotExists
		}
		return ctrl.Result{}, l.createPod(ctx, vmi)
	case err != nil:
		return ctrl.Result{}, err
	case pod.Labels[LabelCreatedBy] != string(vmi.UID):
		// A pod of an earlier VMI of the same name: let it go first.
		if pod.DeletionTimestamp == nil {
			return ctrl.Result{}, client.IgnoreNotFound(l.Delete(ctx, pod))
		}
		return ctrl.Result{}, nil
	}
	return l.mirror(ctx, vmi, pod)
}

func (l *Launcher) createPod(ctx context.Context, vmi *virtv1.VirtualMachineInstance) error {
	pod, err := LauncherPod(vmi, l.Image, Sizing(ctx, l.Client))
	if err != nil {
		return err
	}
	if err := controllerutil.SetControllerReference(vmi, pod, l.Scheme()); err != nil {
		return err
	}
	if err := l.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	base := vmi.DeepCopy()
	vmi.Status.Phase = virtv1.Scheduling
	return l.patchStatus(ctx, vmi, base)
}

// finish is virt-controller's part in a deleted or final VMI's end: the launcher pod of a deleted
// VMI is deleted; a VMI whose pod is gone becomes Failed (as its pod no longer exists); and a final
// VMI without a pod loses the finalizer that virt-api's mutator gave it, so that its deletion
// completes. A VMI on a node whose kubelet is gone keeps its terminating pod, and so stays until
// the pod goes, as with KubeVirt.
func (l *Launcher) finish(ctx context.Context, vmi *virtv1.VirtualMachineInstance, pod *corev1.Pod) (ctrl.Result, error) {
	if pod != nil {
		if vmi.DeletionTimestamp != nil && pod.DeletionTimestamp == nil {
			return ctrl.Result{}, client.IgnoreNotFound(l.Delete(ctx, pod))
		}
		return ctrl.Result{}, nil // the pod's end brings the VMI back here
	}
	if !vmi.IsFinal() {
		return l.mirror(ctx, vmi, nil)
	}
	base := vmi.DeepCopy() // patchStatus writes nothing when neither finalizer is there
	controllerutil.RemoveFinalizer(vmi, virtv1.VirtualMachineInstanceFinalizer)
	controllerutil.RemoveFinalizer(vmi, virtv1.DeprecatedVirtualMachineInstanceFinalizer)
	return ctrl.Result{}, l.patchStatus(ctx, vmi, base)
}

// Sizing is what the cluster's KubeVirt CR says that sizes launchers, as virt-controller reads it
// (none, or none readable: KubeVirt's defaults).
func Sizing(ctx context.Context, c client.Reader) kubevirtsize.Cluster {
	var kvs virtv1.KubeVirtList
	if err := c.List(ctx, &kvs); err != nil {
		return kubevirtsize.ClusterOf(nil, runtime.GOARCH)
	}
	return kubevirtsize.ClusterOfList(kvs.Items, runtime.GOARCH)
}

// LauncherPod builds the launcher-like pod of a VMI: what the scheduler needs to decide as it
// would for KubeVirt's virt-launcher, its compute container's memory sized as KubeVirt configured
// as sizing sizes it (kubevirtsize.LauncherMemory: the VMI's request and limit, each plus
// KubeVirt's overhead, which the pod's annotation states as virt-controller's does).
func LauncherPod(vmi *virtv1.VirtualMachineInstance, image string, sizing kubevirtsize.Cluster) (*corev1.Pod, error) {
	memRequest, memLimit, err := kubevirtsize.LauncherMemory(vmi, sizing)
	if err != nil {
		return nil, err
	}
	overhead := kubevirtsize.Overhead(vmi, sizing)
	requests := corev1.ResourceList{}
	for k, v := range vmi.Spec.Domain.Resources.Requests {
		requests[k] = v.DeepCopy()
	}
	requests[corev1.ResourceMemory] = memRequest
	limits := corev1.ResourceList{}
	for k, v := range vmi.Spec.Domain.Resources.Limits {
		limits[k] = v.DeepCopy()
	}
	if !memLimit.IsZero() {
		limits[corev1.ResourceMemory] = memLimit
	}
	labels := launcherLabels(vmi)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: vmi.Namespace,
			Name:      LauncherPodName(vmi.Name),
			Labels:    labels,
			// kubevirt.io/domain: the VMI's name, by which virt-api's eviction interceptor finds it.
			Annotations: map[string]string{virtv1.MemoryOverheadAnnotationBytes: strconv.FormatInt(overhead.Value(), 10), virtv1.DomainAnnotation: vmi.Name},
		},
		Spec: corev1.PodSpec{
			Affinity:                  vmi.Spec.Affinity.DeepCopy(),
			NodeSelector:              vmi.Spec.NodeSelector,
			Tolerations:               vmi.Spec.Tolerations,
			TopologySpreadConstraints: vmi.Spec.TopologySpreadConstraints,
			PriorityClassName:         vmi.Spec.PriorityClassName,
			SchedulerName:             vmi.Spec.SchedulerName,
			RestartPolicy:             corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name:      "compute",
				Image:     image,
				Resources: corev1.ResourceRequirements{Requests: requests, Limits: limits},
			}},
		},
	}, nil
}

// hostPoll is how often the double looks again at a member whose node's host is down: a host that
// is not up yet (the local cluster makes hosts as it sees their nodes, and a pod may be bound
// first) or that died. Nothing else would bring the VMI back: no event marks a host coming up.
const hostPoll = 2 * time.Second

// mirror writes what the pod (nil: gone) says into the VMI status.
func (l *Launcher) mirror(ctx context.Context, vmi *virtv1.VirtualMachineInstance, pod *corev1.Pod) (ctrl.Result, error) {
	base := vmi.DeepCopy()
	phase, ready := Mirror(pod)
	if l.Domains != nil && vmi.Labels[ftv1.LabelPair] != "" && pod != nil && pod.Spec.NodeName != "" && pod.DeletionTimestamp == nil &&
		(phase == virtv1.Running || phase == virtv1.Scheduled) {
		state, why := l.Domains.State(vmi, pod)
		switch state {
		case HostDown, HostCut:
			// Nothing on a dead or cut host reports: the VMI stays as it was, until its host is
			// up and reaches the API server.
			return ctrl.Result{RequeueAfter: hostPoll}, nil
		case DomainStarting:
			phase, ready = virtv1.Scheduled, notReady("GuestNotRunning", "virt-launcher is starting the domain")
		case DomainExited:
			phase, ready = virtv1.Failed, notReady("DomainExited", why)
		}
	}
	vmi.Status.Phase = phase
	if pod != nil && pod.Spec.NodeName != "" {
		vmi.Status.NodeName = pod.Spec.NodeName
	}
	vmi.Status.Conditions = setCondition(vmi.Status.Conditions, ready)
	if pod != nil {
		vmi.Status.Conditions = setCondition(vmi.Status.Conditions, scheduledCondition(pod))
	}
	return ctrl.Result{}, l.patchStatus(ctx, vmi, base)
}

// Mirror maps a launcher pod (nil: gone) to the VMI phase and Ready condition KubeVirt reports.
func Mirror(pod *corev1.Pod) (virtv1.VirtualMachineInstancePhase, virtv1.VirtualMachineInstanceCondition) {
	switch {
	case pod == nil:
		return virtv1.Failed, notReady(virtv1.PodNotExistsReason, "virt-launcher pod does not exist")
	case pod.DeletionTimestamp != nil:
		phase := virtv1.Scheduled
		if pod.Status.Phase == corev1.PodRunning {
			phase = virtv1.Running
		}
		return phase, notReady(virtv1.PodTerminatingReason, "virt-launcher pod is terminating")
	case pod.Status.Phase == corev1.PodRunning:
		return virtv1.Running, virtv1.VirtualMachineInstanceCondition{Type: virtv1.VirtualMachineInstanceReady, Status: corev1.ConditionTrue}
	case pod.Status.Phase == corev1.PodSucceeded:
		return virtv1.Succeeded, notReady(virtv1.PodNotExistsReason, "virt-launcher pod completed")
	case pod.Status.Phase == corev1.PodFailed:
		return virtv1.Failed, notReady("PodFailed", "virt-launcher pod failed")
	case pod.Spec.NodeName != "":
		return virtv1.Scheduled, notReady("PodNotReady", "virt-launcher pod is starting")
	default:
		return virtv1.Scheduling, notReady("GuestNotRunning", "virt-launcher pod is not scheduled yet")
	}
}

func notReady(reason, msg string) virtv1.VirtualMachineInstanceCondition {
	return virtv1.VirtualMachineInstanceCondition{Type: virtv1.VirtualMachineInstanceReady,
		Status: corev1.ConditionFalse, Reason: reason, Message: msg}
}

func scheduledCondition(pod *corev1.Pod) virtv1.VirtualMachineInstanceCondition {
	c := virtv1.VirtualMachineInstanceCondition{Type: virtv1.VirtualMachineInstanceConditionType(corev1.PodScheduled), Status: corev1.ConditionUnknown}
	for _, pc := range pod.Status.Conditions {
		if pc.Type == corev1.PodScheduled {
			c.Status, c.Reason, c.Message = pc.Status, pc.Reason, pc.Message
		}
	}
	return c
}

// setCondition replaces or adds c, keeping the transition time when the status is unchanged.
func setCondition(conds []virtv1.VirtualMachineInstanceCondition, c virtv1.VirtualMachineInstanceCondition) []virtv1.VirtualMachineInstanceCondition {
	now := metav1.Now()
	for i := range conds {
		if conds[i].Type != c.Type {
			continue
		}
		c.LastTransitionTime = conds[i].LastTransitionTime
		if conds[i].Status != c.Status {
			c.LastTransitionTime = now
		}
		c.LastProbeTime = conds[i].LastProbeTime
		conds[i] = c
		return conds
	}
	c.LastTransitionTime = now
	return append(conds, c)
}

// patchStatus patches the VMI (its CRD has no status subresource, as in KubeVirt) if it changed:
// its status, or its finalizers.
func (l *Launcher) patchStatus(ctx context.Context, vmi, base *virtv1.VirtualMachineInstance) error {
	patch := client.MergeFrom(base)
	data, err := patch.Data(vmi)
	if err != nil || string(data) == "{}" {
		return err
	}
	w := l.VMIWriter
	if w == nil {
		w = l.Client
	}
	return client.IgnoreNotFound(w.Patch(ctx, vmi, patch))
}

// SetupWithManager watches all VMIs and the launcher pods they own.
func (l *Launcher) SetupWithManager(mgr ctrl.Manager) error {
	// virt-controller runs its VMI controller on 10 threads; the full stack boots its few
	// domains one at a time.
	workers := 10
	if l.Domains != nil {
		workers = 1
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("kubevirt-launcher-test-double").
		For(&virtv1.VirtualMachineInstance{}).
		Owns(&corev1.Pod{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers})
	if l.Domains != nil {
		if l.Domains.Changed == nil {
			l.Domains.Changed = make(chan event.GenericEvent, 256)
		}
		b = b.WatchesRawSource(source.Channel(l.Domains.Changed, &handler.EnqueueRequestForObject{}))
	}
	return b.Complete(l)
}
