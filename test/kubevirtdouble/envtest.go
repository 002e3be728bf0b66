// Package kubevirtdouble is a TEST DOUBLE of KubeVirt's virt-controller and virt-handler. Real
// KubeVirt needs real nodes with KVM; the tests have neither, so this stands in for it and for
// nothing else. It has two forms:
//
//   - Launcher (launcher.go), for the local cluster (hack/local-cluster.sh), which has a real
//     scheduler and kwok-simulated kubelets: a launcher-like pod per VMI, placed by the scheduler
//     and mirrored into the VMI status. It runs as the kubevirt-double command.
//   - NodeRunner (this file), for envtest, which has an API server but no scheduler and no
//     kubelets, so no pods: it plays KubeVirt's part in the VMI's life from what lockstep decided.
//     A VMI pinned to a Ready node (lockstep's node label) becomes Scheduled and then Running
//     there, with status.nodeName set. A VMI on a node that is not Ready is left as it is, as
//     virt-handler on a dead node would leave it; its loss is for lockstep to notice. Beside it,
//     LauncherPods (envtest_launchers.go) gives the VMIs of the namespaces that ask for it the
//     finalizer and launcher pod that keep a deleted VMI while its pod lives.
//
// Beside them, VMController (vms.go) plays KubeVirt's VirtualMachine controller in envtest. (In the
// local cluster virt-api is KubeVirt's own: test/kubevirtcontrol.)
package kubevirtdouble

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// NodeRunner runs member VMIs on their pinned node while it is Ready.
type NodeRunner struct {
	client.Client
}

// Reconcile moves one VMI to Running when its node is Ready.
func (d *NodeRunner) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	vmi := &virtv1.VirtualMachineInstance{}
	if err := d.Get(ctx, req.NamespacedName, vmi); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	nodeName := vmi.Labels[ftv1.LabelNode]
	if vmi.DeletionTimestamp != nil || vmi.IsFinal() || vmi.Status.Phase == virtv1.Running || nodeName == "" {
		return ctrl.Result{}, nil
	}
	node := &corev1.Node{}
	if err := d.Get(ctx, types.NamespacedName{Name: nodeName}, node); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !nodeReady(node) {
		return ctrl.Result{}, nil
	}
	base := vmi.DeepCopy()
	vmi.Status.Phase = virtv1.Running
	vmi.Status.NodeName = nodeName
	vmi.Status.Conditions = []virtv1.VirtualMachineInstanceCondition{{Type: virtv1.VirtualMachineInstanceReady, Status: corev1.ConditionTrue}}
	err := d.Patch(ctx, vmi, client.MergeFrom(base))
	if apierrors.IsNotFound(err) {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, err
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// SetupWithManager watches member VMIs, and nodes so that VMIs start when their node is Ready.
func (d *NodeRunner) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("kubevirt-test-double").
		For(&virtv1.VirtualMachineInstance{}).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(vmisOnNode(d.Client))).
		Complete(d)
}

// vmisOnNode maps a node to the member VMIs pinned to it.
func vmisOnNode(c client.Client) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		var vmis virtv1.VirtualMachineInstanceList
		if err := c.List(ctx, &vmis, client.MatchingLabels{ftv1.LabelNode: o.GetName()}); err != nil {
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(vmis.Items))
		for i := range vmis.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&vmis.Items[i])})
		}
		return reqs
	}
}
