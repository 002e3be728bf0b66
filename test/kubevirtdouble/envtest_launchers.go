package kubevirtdouble

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// LabelLauncherPods, on an envtest namespace, makes LauncherPods give its VMIs launcher pods.
const LabelLauncherPods = "test.lockstep.dev/launcher-pods"

// LauncherPods plays, in envtest, the part of KubeVirt that keeps a deleted VMI for as long as its
// launcher pod lives: virt-api's finalizer on every VMI, virt-controller's launcher pod (bound to
// the member's node: envtest has no scheduler) and its deletion of the pod of a deleted VMI,
// and the kubelet that ends a deleted pod, which only a Ready node has. A pod on a node that is
// not Ready stays terminating, and its VMI with it, until someone deletes the pod at once (grace
// 0), as the API server allows. Only the VMIs of namespaces labelled LabelLauncherPods have pods:
// the other envtest specs keep NodeRunner's VMIs, which are deleted at once.
type LauncherPods struct {
	client.Client
}

// Reconcile gives one VMI its finalizer and pod, or, once it is deleted, ends its pod and then
// lets it go.
func (d *LauncherPods) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var ns corev1.Namespace
	if err := d.Get(ctx, types.NamespacedName{Name: req.Namespace}, &ns); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if _, ok := ns.Labels[LabelLauncherPods]; !ok {
		return ctrl.Result{}, nil
	}
	vmi := &virtv1.VirtualMachineInstance{}
	if err := d.Get(ctx, req.NamespacedName, vmi); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if vmi.DeletionTimestamp != nil {
		return ctrl.Result{}, d.finish(ctx, vmi)
	}
	if !controllerutil.ContainsFinalizer(vmi, virtv1.VirtualMachineInstanceFinalizer) {
		base := vmi.DeepCopy()
		controllerutil.AddFinalizer(vmi, virtv1.VirtualMachineInstanceFinalizer)
		if err := d.Patch(ctx, vmi, client.MergeFrom(base)); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
	}
	nodeName := vmi.Labels[ftv1.LabelNode]
	if nodeName == "" {
		return ctrl.Result{}, nil
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			// KubeVirt names it from a generateName; a fixed name keeps the crash tables' rows.
			Name:      LauncherPodName(vmi.Name),
			Namespace: vmi.Namespace,
			Labels:    launcherLabels(vmi),
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(vmi,
				virtv1.VirtualMachineInstanceGroupVersionKind)},
		},
		Spec: corev1.PodSpec{
			NodeName:   nodeName,
			Containers: []corev1.Container{{Name: "compute", Image: "virt-launcher"}},
		},
	}
	return ctrl.Result{}, client.IgnoreAlreadyExists(d.Create(ctx, pod))
}

// finish deletes a deleted VMI's pods (virt-controller) and ends those on Ready nodes (their
// kubelets); once none is left, it removes the finalizer.
func (d *LauncherPods) finish(ctx context.Context, vmi *virtv1.VirtualMachineInstance) error {
	var pods corev1.PodList
	if err := d.List(ctx, &pods, client.InNamespace(vmi.Namespace), client.MatchingLabels{LabelCreatedBy: string(vmi.UID)}); err != nil {
		return err
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		var opts []client.DeleteOption
		if d.nodeReady(ctx, pod.Spec.NodeName) {
			opts = append(opts, client.GracePeriodSeconds(0))
		} else if pod.DeletionTimestamp != nil {
			continue
		}
		if err := d.Delete(ctx, pod, opts...); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	if len(pods.Items) > 0 {
		return nil // the pods' deletion brings the VMI back here
	}
	base := vmi.DeepCopy()
	if !controllerutil.RemoveFinalizer(vmi, virtv1.VirtualMachineInstanceFinalizer) {
		return nil
	}
	return client.IgnoreNotFound(d.Patch(ctx, vmi, client.MergeFrom(base)))
}

func (d *LauncherPods) nodeReady(ctx context.Context, name string) bool {
	node := &corev1.Node{}
	return d.Get(ctx, types.NamespacedName{Name: name}, node) == nil && nodeReady(node)
}

// SetupWithManager watches VMIs, their pods, and nodes (a node Ready again ends its pods).
func (d *LauncherPods) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("kubevirt-test-double-launcher-pods").
		For(&virtv1.VirtualMachineInstance{}).
		Owns(&corev1.Pod{}).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(vmisOnNode(d.Client))).
		Complete(d)
}
