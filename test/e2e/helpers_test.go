//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
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
	"github.com/lockstep-dev/lockstep/test/kubevirtdouble"
	"github.com/lockstep-dev/lockstep/test/localcluster"
)

const (
	// recoveryTimeout bounds a whole recovery: kcm's 8s node grace, the operator's grace and the
	// start of a new member, with room for a busy 2-core machine.
	recoveryTimeout = 2 * time.Minute
	poll            = 250 * time.Millisecond
	// maxPerNode is the operator's default --max-ft-vms-per-node.
	maxPerNode = 4
)

func ctx() context.Context { return suiteCtx }

func nodeNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("node-%d", i+1)
	}
	return names
}

// newNamespace makes a namespace with the logging network in it. When the spec ends, its
// FaultTolerantVMs are deleted and waited for, so that the next spec finds the nodes empty.
func newNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}
	Expect(k8s.Create(ctx(), ns)).To(Succeed())
	Expect(k8s.Create(ctx(), localcluster.LoggingNetwork(ns.Name))).To(Succeed())
	DeferCleanup(func() {
		Expect(k8s.DeleteAllOf(ctx(), &ftv1.FaultTolerantVM{}, client.InNamespace(ns.Name))).To(Succeed())
		Eventually(func(g Gomega) {
			var vmis virtv1.VirtualMachineInstanceList
			g.Expect(k8s.List(ctx(), &vmis, client.InNamespace(ns.Name))).To(Succeed())
			g.Expect(vmis.Items).To(BeEmpty())
			var ftvms ftv1.FaultTolerantVMList
			g.Expect(k8s.List(ctx(), &ftvms, client.InNamespace(ns.Name))).To(Succeed())
			g.Expect(ftvms.Items).To(BeEmpty())
		}).WithTimeout(recoveryTimeout).WithPolling(poll).Should(Succeed())
		Expect(k8s.Delete(ctx(), ns)).To(Succeed())
	})
	return ns.Name
}

// newFTVM creates a FaultTolerantVM with one vCPU and 1 GiB.
func newFTVM(ns, name string) *ftv1.FaultTolerantVM {
	f := ftvm(ns, name)
	Expect(k8s.Create(ctx(), f)).To(Succeed())
	return f
}

// ftvm is a valid FaultTolerantVM with one vCPU and 1 GiB, not yet created.
func ftvm(ns, name string) *ftv1.FaultTolerantVM {
	mem := resource.MustParse("1Gi")
	return &ftv1.FaultTolerantVM{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: ftv1.FaultTolerantVMSpec{
			RunStrategy:    ftv1.RunStrategyRunning,
			LoggingNetwork: ftv1.LoggingNetwork{Name: "ft-logging"},
			Template: ftv1.VMITemplate{Spec: virtv1.VirtualMachineInstanceSpec{Domain: virtv1.DomainSpec{
				CPU:    &virtv1.CPU{Cores: 1},
				Memory: &virtv1.Memory{Guest: &mem},
			}}},
		},
	}
}

func getFTVM(ns, name string) *ftv1.FaultTolerantVM {
	f := &ftv1.FaultTolerantVM{}
	ExpectWithOffset(1, k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: name}, f)).To(Succeed())
	return f
}

// waitProtected waits until the FaultTolerantVM is Protected and returns it.
func waitProtected(ns, name string) *ftv1.FaultTolerantVM {
	var f *ftv1.FaultTolerantVM
	EventuallyWithOffset(1, func(g Gomega) {
		f = &ftv1.FaultTolerantVM{}
		g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: name}, f)).To(Succeed())
		g.Expect(f.Status.State).To(Equal(ftv1.StateProtected), "conditions: %+v", f.Status.Conditions)
		g.Expect(f.Status.Primary).NotTo(BeNil())
		g.Expect(f.Status.Secondary).NotTo(BeNil())
	}).WithTimeout(recoveryTimeout).WithPolling(poll).Should(Succeed())
	return f
}

// waitNotProtected waits until the FaultTolerantVM is NotProtected, with the given reason and a
// message containing each of the parts.
func waitNotProtected(ns, name, reason string, parts ...string) {
	EventuallyWithOffset(1, func(g Gomega) {
		f := &ftv1.FaultTolerantVM{}
		g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: name}, f)).To(Succeed())
		g.Expect(f.Status.State).To(Equal(ftv1.StateNotProtected))
		c := apimeta.FindStatusCondition(f.Status.Conditions, ftv1.ConditionProtected)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(reason))
		for _, part := range parts {
			g.Expect(c.Message).To(ContainSubstring(part))
		}
	}).WithTimeout(recoveryTimeout).WithPolling(poll).Should(Succeed())
}

// members lists the pair's member VMIs.
func members(ns, name string) []virtv1.VirtualMachineInstance {
	var vmis virtv1.VirtualMachineInstanceList
	ExpectWithOffset(1, k8s.List(ctx(), &vmis, client.InNamespace(ns), client.MatchingLabels{ftv1.LabelPair: name, ftv1.LabelManagedBy: ftv1.ManagedByValue})).To(Succeed())
	return vmis.Items
}

// expectPairHealthy checks what Protected must mean in the cluster, not only in status: exactly
// two member VMIs, both Running, primary and secondary on two different nodes that are not in
// avoid, each with its launcher pod bound by the scheduler to the member's node.
func expectPairHealthy(g Gomega, ns, name string, avoid ...string) {
	f := &ftv1.FaultTolerantVM{}
	g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: name}, f)).To(Succeed())
	g.Expect(f.Status.State).To(Equal(ftv1.StateProtected))
	vmis := &virtv1.VirtualMachineInstanceList{}
	g.Expect(k8s.List(ctx(), vmis, client.InNamespace(ns), client.MatchingLabels{ftv1.LabelPair: name, ftv1.LabelManagedBy: ftv1.ManagedByValue})).To(Succeed())
	live := []virtv1.VirtualMachineInstance{}
	for _, v := range vmis.Items {
		if v.DeletionTimestamp == nil {
			live = append(live, v)
		}
	}
	g.Expect(live).To(HaveLen(2), "member VMIs of %s", name)
	roles := map[string]string{}
	for _, v := range live {
		g.Expect(v.Status.Phase).To(Equal(virtv1.Running), "VMI %s", v.Name)
		g.Expect(v.Status.NodeName).To(Equal(v.Labels[ftv1.LabelNode]), "VMI %s runs where it was placed", v.Name)
		g.Expect(avoid).NotTo(ContainElement(v.Status.NodeName), "VMI %s", v.Name)
		pod := &corev1.Pod{}
		g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: kubevirtdouble.LauncherPodName(v.Name)}, pod)).To(Succeed())
		g.Expect(pod.Spec.NodeName).To(Equal(v.Status.NodeName), "the scheduler bound %s's launcher pod to its node", v.Name)
		roles[v.Labels[ftv1.LabelRole]] = v.Status.NodeName
	}
	g.Expect(roles).To(HaveKey(ftv1.RolePrimary))
	g.Expect(roles).To(HaveKey(ftv1.RoleSecondary))
	g.Expect(roles[ftv1.RolePrimary]).NotTo(Equal(roles[ftv1.RoleSecondary]), "the pair shares a node")
	g.Expect(f.Status.Primary.Node).To(Equal(roles[ftv1.RolePrimary]))
	g.Expect(f.Status.Secondary.Node).To(Equal(roles[ftv1.RoleSecondary]))
}

// membersPerNode counts member VMIs (not being deleted) by the node placement chose.
func membersPerNode() map[string]int {
	var vmis virtv1.VirtualMachineInstanceList
	Expect(k8s.List(ctx(), &vmis, client.HasLabels{ftv1.LabelPair})).To(Succeed())
	count := map[string]int{}
	for _, v := range vmis.Items {
		if v.DeletionTimestamp == nil {
			count[v.Labels[ftv1.LabelNode]]++
		}
	}
	return count
}

// killNode makes the node's host die; the spec revives it when it ends.
func killNode(name string) time.Time {
	By("killing node " + name)
	at := time.Now()
	cluster("kill-node", name)
	DeferCleanup(reviveNode, name)
	return at
}

// reviveNode brings the node back and waits until it is Ready.
func reviveNode(name string) {
	By("reviving node " + name)
	cluster("revive-node", name)
	waitNodesReady(name)
}

func waitNodesReady(names ...string) {
	EventuallyWithOffset(1, func(g Gomega) {
		for _, n := range names {
			node := &corev1.Node{}
			g.Expect(k8s.Get(ctx(), types.NamespacedName{Name: n}, node)).To(Succeed())
			g.Expect(nodeReady(node)).To(BeTrue(), "node %s Ready", n)
			for _, t := range node.Spec.Taints {
				g.Expect(t.Key).NotTo(HavePrefix("node.kubernetes.io/"), "node %s taint", n)
			}
		}
	}).WithTimeout(recoveryTimeout).WithPolling(poll).Should(Succeed())
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// annotateNode sets (or, with value "", removes) an annotation of a node until the spec ends.
func annotateNode(name, key, value string) {
	patch := func(v *string) {
		ExpectWithOffset(2, k8s.Patch(ctx(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}},
			client.RawPatch(types.MergePatchType, []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, key, jsonOrNull(v)))))).To(Succeed())
	}
	patch(&value)
	DeferCleanup(func() { patch(nil) })
}

func jsonOrNull(v *string) string {
	if v == nil {
		return "null"
	}
	return fmt.Sprintf("%q", *v)
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }

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
