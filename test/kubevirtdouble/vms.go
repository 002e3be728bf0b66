package kubevirtdouble

import (
	"context"
	"crypto/sha256"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	virtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// VMController is a TEST DOUBLE of KubeVirt's VirtualMachine controller (virt-controller) and of
// what virt-handler reports of the VMI it starts, for envtest, which has neither a scheduler nor
// a garbage collector. Of KubeVirt's behaviour it keeps what adoption and release depend on:
//
//   - a VirtualMachine whose run strategy runs it (Always, RerunOnFailure, or spec.running true)
//     gets a VMI of its name, controlled by it, from its template; the VMI has the template's
//     firmware UUID, else the VirtualMachine's UID (a stand-in for the random UUID that KubeVirt's
//     webhook writes into a new VirtualMachine's spec), and runs at once on the first Ready node,
//     reporting each interface's MAC: the template's, else one made up as a CNI would;
//   - a VirtualMachine set to Halted has its VMI deleted;
//   - a VMI whose VirtualMachine is gone is deleted, as the garbage collector would.
//
// It does not write the VirtualMachine's status, add KubeVirt's finalizer, persist the firmware
// UUID into the VirtualMachine, or handle the Manual and Once run strategies.
type VMController struct {
	client.Client
}

// Reconcile starts or stops one VirtualMachine's VMI.
func (d *VMController) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	vmi := &virtv1.VirtualMachineInstance{}
	if err := d.Get(ctx, req.NamespacedName, vmi); apierrors.IsNotFound(err) {
		vmi = nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	vm := &virtv1.VirtualMachine{}
	if err := d.Get(ctx, req.NamespacedName, vm); apierrors.IsNotFound(err) {
		if vmi != nil && ownedByVM(vmi) {
			return ctrl.Result{}, client.IgnoreNotFound(d.Delete(ctx, vmi))
		}
		return ctrl.Result{}, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	switch {
	case !runs(vm) && vmi != nil && vmi.DeletionTimestamp == nil:
		return ctrl.Result{}, client.IgnoreNotFound(d.Delete(ctx, vmi))
	case runs(vm) && vmi == nil && vm.DeletionTimestamp == nil && vm.Spec.Template != nil:
		return ctrl.Result{}, d.start(ctx, vm)
	}
	return ctrl.Result{}, nil
}

func (d *VMController) start(ctx context.Context, vm *virtv1.VirtualMachine) error {
	var nodes corev1.NodeList
	if err := d.List(ctx, &nodes); err != nil {
		return err
	}
	node := ""
	for i := range nodes.Items {
		if nodeReady(&nodes.Items[i]) && (node == "" || nodes.Items[i].Name < node) {
			node = nodes.Items[i].Name
		}
	}
	if node == "" {
		return fmt.Errorf("no Ready node for VirtualMachine %s", vm.Name)
	}
	vmi := &virtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{
			Name: vm.Name, Namespace: vm.Namespace,
			Labels: vm.Spec.Template.ObjectMeta.Labels, Annotations: vm.Spec.Template.ObjectMeta.Annotations,
		},
		Spec: *vm.Spec.Template.Spec.DeepCopy(),
	}
	if vmi.Spec.Domain.Firmware == nil {
		vmi.Spec.Domain.Firmware = &virtv1.Firmware{}
	}
	if vmi.Spec.Domain.Firmware.UUID == "" {
		vmi.Spec.Domain.Firmware.UUID = vm.UID
	}
	if err := controllerutil.SetControllerReference(vm, vmi, d.Scheme()); err != nil {
		return err
	}
	if err := d.Create(ctx, vmi); err != nil {
		return client.IgnoreAlreadyExists(err)
	}
	base := vmi.DeepCopy()
	vmi.Status.Phase = virtv1.Running
	vmi.Status.NodeName = node
	vmi.Status.Conditions = []virtv1.VirtualMachineInstanceCondition{{Type: virtv1.VirtualMachineInstanceReady, Status: corev1.ConditionTrue}}
	for _, iface := range vmi.Spec.Domain.Devices.Interfaces {
		mac := iface.MacAddress
		if mac == "" {
			mac = madeUpMAC(string(vmi.UID), iface.Name)
		}
		vmi.Status.Interfaces = append(vmi.Status.Interfaces, virtv1.VirtualMachineInstanceNetworkInterface{Name: iface.Name, MAC: mac})
	}
	return d.Patch(ctx, vmi, client.MergeFrom(base))
}

// runs says whether a VirtualMachine's run strategy keeps a VMI running.
func runs(vm *virtv1.VirtualMachine) bool {
	if vm.Spec.RunStrategy != nil {
		return *vm.Spec.RunStrategy == virtv1.RunStrategyAlways || *vm.Spec.RunStrategy == virtv1.RunStrategyRerunOnFailure
	}
	return vm.Spec.Running != nil && *vm.Spec.Running //nolint:staticcheck // KubeVirt still serves spec.running
}

func ownedByVM(vmi *virtv1.VirtualMachineInstance) bool {
	owner := metav1.GetControllerOf(vmi)
	return owner != nil && owner.Kind == "VirtualMachine"
}

// madeUpMAC is a locally administered unicast MAC, new for every VMI, as a CNI plugin gives one.
func madeUpMAC(vmiUID, iface string) string {
	b := sha256.Sum256([]byte(vmiUID + "/" + iface))
	return fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3], b[4])
}

// SetupWithManager watches VirtualMachines and the VMIs they control.
func (d *VMController) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("kubevirt-vm-test-double").
		For(&virtv1.VirtualMachine{}).
		Owns(&virtv1.VirtualMachineInstance{}).
		Complete(d)
}
