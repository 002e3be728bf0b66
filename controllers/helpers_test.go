package controllers_test

import (
	"context"
	"fmt"
	"time"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/test/ftevents"
)

const (
	timeout  = 30 * time.Second
	interval = 100 * time.Millisecond
)

// newNamespace makes a namespace with the logging network in it.
func newNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "ft-"}}
	Expect(k8s.Create(ctx(), ns)).To(Succeed())
	Expect(k8s.Create(ctx(), &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "ft-logging", Namespace: ns.Name},
		Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"0.3.1","type":"macvlan","master":"eth1"}`},
	})).To(Succeed())
	return ns.Name
}

func ctx() context.Context { return suiteCtx }

// labelTestNode marks the nodes the tests make.
const labelTestNode = "lockstep.test/node"

// nodeName is the node a spec calls name: node names are the spec's own, so that nothing another
// spec left behind can ever hold a slot on them.
func nodeName(name string) string {
	return fmt.Sprintf("s%d-%s", CurrentSpecReport().LeafNodeLocation.LineNumber, name)
}

// makeNode creates a Ready node with a zone label, named by nodeName, and returns its name.
func makeNode(name, zone string) string {
	name = nodeName(name)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		corev1.LabelHostname: name, corev1.LabelTopologyZone: zone, labelTestNode: "true",
	}}}
	Expect(k8s.Create(ctx(), node)).To(Succeed())
	setNodeReady(name, true)
	return name
}

// setNodeReady sets the node's Ready condition; a node set not Ready went down an hour ago, so
// that it is lost at once. It also does what the node lifecycle controller (not running in
// envtest) would: the not-ready taint that admission puts on a new node goes when it is Ready.
func setNodeReady(name string, ready bool) {
	Eventually(func() error {
		node := &corev1.Node{}
		if err := k8s.Get(ctx(), types.NamespacedName{Name: name}, node); err != nil {
			return err
		}
		var taints []corev1.Taint
		for _, t := range node.Spec.Taints {
			if t.Key != corev1.TaintNodeNotReady || !ready {
				taints = append(taints, t)
			}
		}
		node.Spec.Taints = taints
		return k8s.Update(ctx(), node)
	}, timeout, interval).Should(Succeed())
	Eventually(func() error {
		node := &corev1.Node{}
		if err := k8s.Get(ctx(), types.NamespacedName{Name: name}, node); err != nil {
			return err
		}
		status, since := corev1.ConditionTrue, metav1.Now()
		if !ready {
			status, since = corev1.ConditionUnknown, metav1.NewTime(time.Now().Add(-time.Hour))
		}
		node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastTransitionTime: since, LastHeartbeatTime: since, Reason: "Test"}}
		node.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourceMemory: resource.MustParse("64Gi")}
		node.Status.Allocatable = node.Status.Capacity
		return k8s.Status().Update(ctx(), node)
	}, timeout, interval).Should(Succeed())
}

// setNodeUnknownSince makes the node stop answering at since (Ready Unknown from then): suspect
// until the grace runs out from since, then lost (setNodeReady's not Ready is lost at once).
func setNodeUnknownSince(name string, since metav1.Time) {
	GinkgoHelper()
	node := &corev1.Node{}
	Expect(k8s.Get(ctx(), types.NamespacedName{Name: name}, node)).To(Succeed())
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, LastTransitionTime: since, Reason: "Test"}}
	Expect(k8s.Status().Update(ctx(), node)).To(Succeed())
}

// deleteAllNodes removes the nodes the tests made.
func deleteAllNodes() {
	Expect(k8s.DeleteAllOf(ctx(), &corev1.Node{}, client.HasLabels{labelTestNode})).To(Succeed())
	Eventually(func() int {
		var nodes corev1.NodeList
		Expect(k8s.List(ctx(), &nodes, client.HasLabels{labelTestNode})).To(Succeed())
		return len(nodes.Items)
	}, timeout, interval).Should(BeZero())
}

// deleteAllFTVMs deletes the FaultTolerantVMs of a namespace and waits until they are gone;
// their finalizer removes everything the operator made (expectNothingLeft checks it).
func deleteAllFTVMs(ns string) {
	Expect(k8s.DeleteAllOf(ctx(), &ftv1.FaultTolerantVM{}, client.InNamespace(ns))).To(Succeed())
	Eventually(func() int {
		var list ftv1.FaultTolerantVMList
		Expect(k8s.List(ctx(), &list, client.InNamespace(ns))).To(Succeed())
		return len(list.Items)
	}, timeout, interval).Should(BeZero())
}

// leftovers lists what the operator made and a test made that is still in the cluster.
func leftovers() []string {
	var out []string
	var ftvms ftv1.FaultTolerantVMList
	Expect(k8s.List(ctx(), &ftvms)).To(Succeed())
	for _, f := range ftvms.Items {
		out = append(out, "FaultTolerantVM "+f.Namespace+"/"+f.Name)
	}
	var vms virtv1.VirtualMachineList
	Expect(k8s.List(ctx(), &vms)).To(Succeed())
	for _, v := range vms.Items {
		out = append(out, "VirtualMachine "+v.Namespace+"/"+v.Name)
	}
	var vmis virtv1.VirtualMachineInstanceList
	Expect(k8s.List(ctx(), &vmis)).To(Succeed())
	for _, v := range vmis.Items {
		out = append(out, "VirtualMachineInstance "+v.Namespace+"/"+v.Name)
	}
	managed := client.MatchingLabels{ftv1.LabelManagedBy: ftv1.ManagedByValue}
	var pvcs corev1.PersistentVolumeClaimList
	Expect(k8s.List(ctx(), &pvcs, managed)).To(Succeed())
	for _, c := range pvcs.Items {
		// A deleted claim keeps kubernetes.io/pvc-protection until kube-controller-manager, which
		// envtest does not run, removes it: being deleted is all the operator can do.
		if c.DeletionTimestamp == nil {
			out = append(out, "PersistentVolumeClaim "+c.Namespace+"/"+c.Name)
		}
	}
	var leases coordinationv1.LeaseList
	Expect(k8s.List(ctx(), &leases, managed)).To(Succeed())
	for _, l := range leases.Items {
		out = append(out, "Lease "+l.Namespace+"/"+l.Name)
	}
	var nads nadv1.NetworkAttachmentDefinitionList
	Expect(k8s.List(ctx(), &nads, managed)).To(Succeed())
	for _, n := range nads.Items {
		out = append(out, "NetworkAttachmentDefinition "+n.Namespace+"/"+n.Name)
	}
	var nodes corev1.NodeList
	Expect(k8s.List(ctx(), &nodes, client.HasLabels{labelTestNode})).To(Succeed())
	for _, n := range nodes.Items {
		out = append(out, "Node "+n.Name)
	}
	return out
}

// createClaim makes a ReadWriteOnce claim of size in ns, as a user would.
func createClaim(ns, name, size string) {
	GinkgoHelper()
	Expect(k8s.Create(ctx(), &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	})).To(Succeed())
}

// expectNothingLeft fails, naming the spec, when a spec left anything behind: the next spec
// must find the cluster as the suite started it.
func expectNothingLeft() {
	spec := CurrentSpecReport().FullText()
	Eventually(leftovers, timeout, interval).Should(BeEmpty(), "spec %q left these behind", spec)
}

// newFTVM is a 1 vCPU, 1 GiB FaultTolerantVM.
func newFTVM(ns, name string) *ftv1.FaultTolerantVM {
	guest := resource.MustParse("1Gi")
	return &ftv1.FaultTolerantVM{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: ftv1.FaultTolerantVMSpec{
			LoggingNetwork: ftv1.LoggingNetwork{Name: "ft-logging"},
			Template: ftv1.VMITemplate{
				Metadata: ftv1.VMITemplateMeta{Labels: map[string]string{"app": name}},
				Spec: virtv1.VirtualMachineInstanceSpec{
					Domain: virtv1.DomainSpec{
						CPU:    &virtv1.CPU{Cores: 1},
						Memory: &virtv1.Memory{Guest: &guest},
						Devices: virtv1.Devices{
							Disks:      []virtv1.Disk{{Name: "root", DiskDevice: virtv1.DiskDevice{Disk: &virtv1.DiskTarget{Bus: virtv1.DiskBusVirtio}}}},
							Interfaces: []virtv1.Interface{{Name: "default", InterfaceBindingMethod: virtv1.InterfaceBindingMethod{Masquerade: &virtv1.InterfaceMasquerade{}}}},
						},
					},
					Networks: []virtv1.Network{{Name: "default", NetworkSource: virtv1.NetworkSource{Pod: &virtv1.PodNetwork{}}}},
					Volumes: []virtv1.Volume{{Name: "root", VolumeSource: virtv1.VolumeSource{
						ContainerDisk: &virtv1.ContainerDiskSource{Image: "quay.io/containerdisks/fedora:latest"},
					}}},
				},
			},
		},
	}
}

// newDiskFTVM is FaultTolerantVM "vm" whose root disk is claim "disk" (1Gi), which it creates.
func newDiskFTVM(ns string) *ftv1.FaultTolerantVM {
	GinkgoHelper()
	createClaim(ns, "disk", "1Gi")
	f := newFTVM(ns, "vm")
	f.Spec.Template.Spec.Volumes[0].VolumeSource = virtv1.VolumeSource{PersistentVolumeClaim: &virtv1.PersistentVolumeClaimVolumeSource{
		PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "disk"}}}
	return f
}

// setProtection patches the FaultTolerantVM's spec.protection.
func setProtection(ns, name string, p ftv1.Protection) {
	f := getFTVM(ns, name)
	base := f.DeepCopy()
	f.Spec.Protection = p
	Expect(k8s.Patch(ctx(), f, client.MergeFrom(base))).To(Succeed())
}

func getFTVM(ns, name string) *ftv1.FaultTolerantVM {
	ftvm := &ftv1.FaultTolerantVM{}
	Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: name}, ftvm)).To(Succeed())
	return ftvm
}

// waitForState waits until the FaultTolerantVM is in the state and returns it.
func waitForState(ns, name string, state ftv1.FTState) *ftv1.FaultTolerantVM {
	GinkgoHelper()
	return waitFor(ns, name, "state "+string(state), func(f *ftv1.FaultTolerantVM) bool { return f.Status.State == state })
}

// waitFor waits until the FaultTolerantVM satisfies ok and returns it; a failed read is retried.
func waitFor(ns, name, what string, ok func(*ftv1.FaultTolerantVM) bool) *ftv1.FaultTolerantVM {
	GinkgoHelper()
	var ftvm *ftv1.FaultTolerantVM
	Eventually(func(g Gomega) {
		ftvm = &ftv1.FaultTolerantVM{}
		g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: name}, ftvm)).To(Succeed())
		g.Expect(ok(ftvm)).To(BeTrue(), "want %s; state %s, conditions %s", what, ftvm.Status.State, conditionsOf(ftvm))
	}, timeout, interval).Should(Succeed())
	return ftvm
}

func conditionsOf(ftvm *ftv1.FaultTolerantVM) string {
	out := ""
	for _, c := range ftvm.Status.Conditions {
		out += fmt.Sprintf("[%s=%s %s: %s] ", c.Type, c.Status, c.Reason, c.Message)
	}
	return out
}

func condition(ftvm *ftv1.FaultTolerantVM, typ string) *metav1.Condition {
	return apimeta.FindStatusCondition(ftvm.Status.Conditions, typ)
}

// members lists the member VMIs of a FaultTolerantVM.
func members(ns, name string) []virtv1.VirtualMachineInstance {
	var vmis virtv1.VirtualMachineInstanceList
	Expect(k8s.List(ctx(), &vmis, client.InNamespace(ns), client.MatchingLabels{ftv1.LabelPair: name})).To(Succeed())
	return vmis.Items
}

func getVMI(ns, name string) (*virtv1.VirtualMachineInstance, error) {
	vmi := &virtv1.VirtualMachineInstance{}
	err := k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: name}, vmi)
	return vmi, err
}

func isGone(ns, name string) func() bool {
	return func() bool {
		_, err := getVMI(ns, name)
		return apierrors.IsNotFound(err)
	}
}

// getVMIAnnotation reads one annotation of a VMI ("" when absent).
func getVMIAnnotation(ns, name, key string) string {
	vmi, err := getVMI(ns, name)
	Expect(err).NotTo(HaveOccurred())
	return vmi.Annotations[key]
}

// eventReasons lists the reasons of the events about a FaultTolerantVM.
func eventReasons(ns, name string) []string {
	reasons, err := ftevents.Reasons(ctx(), k8s, ns, name)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return reasons
}

// eventMessages joins the messages of a FaultTolerantVM's events with the given reason.
func eventMessages(ns, name, reason string) string {
	msgs, err := ftevents.Messages(ctx(), k8s, ns, name, reason)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return msgs
}
