//go:build e2e

package e2e

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// The specs share the cluster's nodes, so they run one after another (Ginkgo's default); each
// leaves the nodes as it found them.
var _ = Describe("lockstep on a local cluster", func() {
	It("keeps pairs apart and the per-node FT limit with 30 FaultTolerantVMs on 6 nodes, and protects waiting VMs when a node is added", func() {
		ns := newNamespace()
		// 5 nodes x 4 members + 3 on node-6: 23 slots, an odd number, so that some VM must run
		// alone (NotProtected) once whole pairs no longer fit anywhere.
		annotateNode("node-6", ftv1.AnnotationNodeMaxVMs, "3")
		limit := func(node string) int {
			if node == "node-6" {
				return 3
			}
			return maxPerNode
		}
		const vms = 30
		for i := 1; i <= vms; i++ {
			newFTVM(ns, fmt.Sprintf("vm-%02d", i))
		}

		By("waiting until every slot is taken and every FaultTolerantVM is Protected or says why it is not")
		var protected int
		var lone []string // NotProtected, with a running primary
		Eventually(func(g Gomega) {
			var list ftv1.FaultTolerantVMList
			g.Expect(k8s.List(ctx(), &list, client.InNamespace(ns))).To(Succeed())
			g.Expect(list.Items).To(HaveLen(vms))
			protected, lone = 0, nil
			for _, f := range list.Items {
				c := apimeta.FindStatusCondition(f.Status.Conditions, ftv1.ConditionProtected)
				g.Expect(c).NotTo(BeNil(), f.Name)
				switch f.Status.State {
				case ftv1.StateProtected:
					protected++
				case ftv1.StateNotProtected:
					g.Expect(c.Reason).To(Equal(ftv1.ReasonNoEligibleNode), "%s: %s", f.Name, c.Message)
					g.Expect(c.Message).To(ContainSubstring("FT VM limit reached"), f.Name)
					if f.Status.Primary != nil {
						lone = append(lone, f.Name)
					}
				default:
					g.Expect(f.Status.State).To(BeElementOf(ftv1.StateProtected, ftv1.StateNotProtected), "%s: %s", f.Name, c.Message)
				}
			}
			perNode := membersPerNode()
			g.Expect(perNode).To(HaveLen(6))
			for node, n := range perNode {
				g.Expect(n).To(Equal(limit(node)), "members on %s", node)
			}
		}).WithTimeout(recoveryTimeout).WithPolling(time.Second).Should(Succeed())
		GinkgoWriter.Printf("23 slots: %d pairs Protected, %d primaries running alone %v\n", protected, len(lone), lone)
		Expect(2*protected+len(lone)).To(Equal(23), "every slot holds a member")
		Expect(lone).NotTo(BeEmpty(), "an odd number of slots leaves a primary alone")
		Expect(len(lone)).To(BeNumerically("<=", 3), "lone primaries only once no two nodes have room")

		By("checking the pairs in the cluster: distinct nodes, launcher pods bound by the scheduler, none pending")
		var list ftv1.FaultTolerantVMList
		Expect(k8s.List(ctx(), &list, client.InNamespace(ns))).To(Succeed())
		for _, f := range list.Items {
			if f.Status.State == ftv1.StateProtected {
				Eventually(func(g Gomega) { expectPairHealthy(g, ns, f.Name) }).WithTimeout(recoveryTimeout).Should(Succeed())
			}
		}
		var pods corev1.PodList
		Expect(k8s.List(ctx(), &pods, client.InNamespace(ns))).To(Succeed())
		Expect(pods.Items).To(HaveLen(23))
		perNode := map[string]int{}
		for _, p := range pods.Items {
			Expect(p.Spec.NodeName).NotTo(BeEmpty(), "pod %s is scheduled", p.Name)
			perNode[p.Spec.NodeName]++
		}
		for node, n := range perNode {
			Expect(n).To(Equal(limit(node)), "launcher pods on %s", node)
		}

		By("adding a node: the VMs running alone get their secondaries there before anything new starts")
		cluster("add-node", "node-7", "zone-a")
		DeferCleanup(func() {
			Expect(k8s.Delete(ctx(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-7"}})).To(Succeed())
		})
		added := time.Now()
		for _, name := range lone {
			Eventually(func(g Gomega) { expectPairHealthy(g, ns, name) }).
				WithTimeout(recoveryTimeout).WithPolling(poll).Should(Succeed(), "%s was running alone", name)
			Expect(getFTVM(ns, name).Status.Secondary.Node).To(Equal("node-7"))
		}
		timings.Add("30 FTVMs: node added -> the VMs that ran alone Protected", time.Since(added))
		Eventually(func(g Gomega) {
			g.Expect(membersPerNode()).To(HaveKeyWithValue("node-7", maxPerNode))
		}).WithTimeout(recoveryTimeout).WithPolling(time.Second).Should(Succeed())
		Consistently(func(g Gomega) {
			for node, n := range membersPerNode() {
				g.Expect(n).To(BeNumerically("<=", limit(node)), "members on %s", node)
			}
		}).WithTimeout(3 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
	})

	It("has the scheduler enforce the pair's anti-affinity, not only the operator's placement", func() {
		ns := newNamespace()
		newFTVM(ns, "db")
		f := waitProtected(ns, "db")
		primary := &virtv1.VirtualMachineInstance{}
		Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: f.Status.Primary.VMI}, primary)).To(Succeed())

		By("starting a VMI that carries the pair's label and the primary's scheduling terms, pinned to the secondary's node")
		// Not managed by lockstep (no managed-by label), so only the scheduler judges it.
		rogue := &virtv1.VirtualMachineInstance{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "rogue", Labels: map[string]string{ftv1.LabelPair: "db"}},
			Spec:       *primary.Spec.DeepCopy(),
		}
		rogue.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{
				Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{f.Status.Secondary.Node},
			}}}},
		}}
		Expect(k8s.Create(ctx(), rogue)).To(Succeed())
		DeferCleanup(func() { Expect(k8s.Delete(ctx(), rogue)).To(Succeed()) })
		Eventually(func(g Gomega) {
			v := &virtv1.VirtualMachineInstance{}
			g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "rogue"}, v)).To(Succeed())
			g.Expect(v.Status.Phase).To(Equal(virtv1.Scheduling))
			var scheduled *virtv1.VirtualMachineInstanceCondition
			for i := range v.Status.Conditions {
				if string(v.Status.Conditions[i].Type) == string(corev1.PodScheduled) {
					scheduled = &v.Status.Conditions[i]
				}
			}
			g.Expect(scheduled).NotTo(BeNil())
			g.Expect(scheduled.Status).To(Equal(corev1.ConditionFalse))
			g.Expect(scheduled.Message).To(ContainSubstring("anti-affinity"))
			GinkgoWriter.Printf("the scheduler: %s\n", scheduled.Message)
		}).WithTimeout(recoveryTimeout).WithPolling(poll).Should(Succeed())
		Consistently(func(g Gomega) { expectPairHealthy(g, ns, "db") }).
			WithTimeout(2 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
	})

	It("promotes the secondary when the primary's node dies, and starts a new secondary elsewhere", func() {
		ns := newNamespace()
		newFTVM(ns, "db")
		before := waitProtected(ns, "db")
		oldPrimary, oldSecondary := before.Status.Primary.Node, before.Status.Secondary.Node
		killed := killNode(oldPrimary)

		promoted := awaitFailoverCount(ns, "db", 1)
		f := getFTVM(ns, "db")
		Expect(f.Status.Primary.Node).To(Equal(oldSecondary), "the secondary took over where it ran")
		Eventually(func(g Gomega) { expectPairHealthy(g, ns, "db", oldPrimary) }).
			WithTimeout(recoveryTimeout).WithPolling(poll).Should(Succeed())
		reprotected := time.Now()
		timings.Add("primary's node killed -> secondary promoted", promoted.Sub(killed))
		timings.Add("primary's node killed -> Protected again (new secondary Running)", reprotected.Sub(killed))

		f = getFTVM(ns, "db")
		Expect(f.Status.FailoverCount).To(Equal(int32(1)))
		Expect(f.Status.LastFailoverTime).NotTo(BeNil())
		Expect(eventReasons(ns, "db")).To(ContainElement(ftv1.ReasonPromoted))
		// The node controller marks the node Ready=Unknown and then taints it unreachable, rate
		// limited per zone (--node-eviction-rate): the operator may judge it lost on either.
		Expect(eventMessages(ns, "db", ftv1.ReasonPromoted)).To(MatchRegexp(`node %s is Node(Unreachable|NotReady) since`, oldPrimary))
	})

	It("starts a new secondary when the secondary's node dies, and leaves the primary alone", func() {
		ns := newNamespace()
		newFTVM(ns, "web")
		before := waitProtected(ns, "web")
		primaryVMI := before.Status.Primary.VMI
		oldSecondary := before.Status.Secondary.Node
		killed := killNode(oldSecondary)

		Eventually(func(g Gomega) {
			expectPairHealthy(g, ns, "web", oldSecondary)
		}).WithTimeout(recoveryTimeout).WithPolling(poll).Should(Succeed())
		timings.Add("secondary's node killed -> Protected again (new secondary Running)", time.Since(killed))
		f := getFTVM(ns, "web")
		Expect(f.Status.Primary.VMI).To(Equal(primaryVMI), "the primary never moved")
		Expect(f.Status.FailoverCount).To(BeZero())
		Expect(eventReasons(ns, "web")).To(ContainElement(ftv1.ReasonSecondaryLost))
	})

	It("recovers every pair when two nodes die at once; a pair that lost both members restarts", func() {
		// The two nodes to kill are those of pair a, so at least one pair loses both members.
		ns := newNamespace()
		for _, n := range []string{"a", "b", "c", "d", "e"} {
			newFTVM(ns, n)
		}
		for _, n := range []string{"a", "b", "c", "d", "e"} {
			waitProtected(ns, n)
		}
		a := getFTVM(ns, "a")
		dead := []string{a.Status.Primary.Node, a.Status.Secondary.Node}
		before := map[string]*ftv1.FaultTolerantVM{}
		for _, n := range []string{"a", "b", "c", "d", "e"} {
			before[n] = getFTVM(ns, n)
		}
		killed := killNode(dead[0])
		killNode(dead[1])

		for _, n := range []string{"a", "b", "c", "d", "e"} {
			Eventually(func(g Gomega) { expectPairHealthy(g, ns, n, dead...) }).
				WithTimeout(recoveryTimeout).WithPolling(poll).Should(Succeed(), "pair %s", n)
		}
		timings.Add("two nodes killed -> all 5 pairs Protected again", time.Since(killed))

		for n, b := range before {
			after := getFTVM(ns, n)
			switch {
			case contains(dead, b.Status.Primary.Node) && contains(dead, b.Status.Secondary.Node):
				// Both members were lost: no copy of the running VM survived, so it restarted from
				// its disks. That is not a failover, and the events say so.
				Expect(after.Status.FailoverCount).To(BeZero(), n)
				Expect(eventReasons(ns, n)).To(ContainElement(ftv1.ReasonPrimaryLost), n)
			case contains(dead, b.Status.Primary.Node):
				Expect(after.Status.FailoverCount).To(Equal(int32(1)), n)
				Expect(after.Status.Primary.VMI).To(Equal(b.Status.Secondary.VMI), "pair %s: its secondary was promoted", n)
			default:
				Expect(after.Status.FailoverCount).To(BeZero(), n)
				Expect(after.Status.Primary.VMI).To(Equal(b.Status.Primary.VMI), "pair %s kept its primary", n)
			}
		}
	})

	It("re-protects a VM when its lost node comes back and no other node is eligible", func() {
		ns := newNamespace()
		// Only node-1 and node-2 may hold FT VMs.
		for _, n := range nodeNames(6)[2:] {
			annotateNode(n, ftv1.AnnotationNodeMaxVMs, "0")
		}
		newFTVM(ns, "ledger")
		before := waitProtected(ns, "ledger")
		lost := before.Status.Primary.Node
		killNode(lost)

		By("waiting for the promotion, then NotProtected: no node can take a new secondary")
		awaitFailoverCount(ns, "ledger", 1)
		waitNotProtected(ns, "ledger", ftv1.ReasonNoEligibleNode, "FT VM limit", "not Ready")

		By("bringing the node back")
		back := time.Now()
		reviveNode(lost)
		Eventually(func(g Gomega) { expectPairHealthy(g, ns, "ledger") }).
			WithTimeout(recoveryTimeout).WithPolling(poll).Should(Succeed())
		timings.Add("lost node back (Ready) -> Protected with a secondary on it", time.Since(back))
		f := getFTVM(ns, "ledger")
		Expect(f.Status.Secondary.Node).To(Equal(lost))
		Expect(f.Status.FailoverCount).To(Equal(int32(1)), "coming back does not fail over again")
		By("checking that the old primary's launcher pod, stuck on the dead node, is gone now that its kubelet is back")
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "virt-launcher-" + before.Status.Primary.VMI}, &corev1.Pod{})).
				To(MatchError(isNotFound, "NotFound"))
		}).WithTimeout(recoveryTimeout).WithPolling(poll).Should(Succeed())
	})

	It("deletes a FaultTolerantVM in the middle of a failover without leaving anything behind", func() {
		ns := newNamespace()
		newFTVM(ns, "cache")
		before := waitProtected(ns, "cache")

		By("holding KubeVirt (the test double) still, so that the new secondary cannot start")
		cluster("stop", "kubevirt-double")
		DeferCleanup(cluster, "start", "kubevirt-double")
		killNode(before.Status.Primary.Node)
		awaitFailoverCount(ns, "cache", 1)
		Eventually(func(g Gomega) {
			f := &ftv1.FaultTolerantVM{}
			g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "cache"}, f)).To(Succeed())
			g.Expect(f.Status.Secondary).NotTo(BeNil(), "a new secondary was created")
			g.Expect(f.Status.Secondary.Phase).NotTo(Equal(string(virtv1.Running)))
		}).WithTimeout(recoveryTimeout).WithPolling(poll).Should(Succeed())

		By("deleting it mid-failover, then letting KubeVirt go on")
		Expect(k8s.Delete(ctx(), getFTVM(ns, "cache"))).To(Succeed())
		// virt-api gives every VMI a finalizer that virt-controller (the double, here) removes
		// once the VMI's pod is gone: with KubeVirt held still no VMI could go. The old primary's
		// VMI, on the dead node, goes once the operator has deleted its launcher pod: its node is
		// lost, and the pair's record, released for the deletion, has had no holder for a term.
		cluster("start", "kubevirt-double")
		Eventually(func(g Gomega) {
			err := k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "cache"}, &ftv1.FaultTolerantVM{})
			g.Expect(err).To(MatchError(isNotFound, "NotFound"))
			var vmis virtv1.VirtualMachineInstanceList
			g.Expect(k8s.List(ctx(), &vmis, client.InNamespace(ns))).To(Succeed())
			g.Expect(vmis.Items).To(BeEmpty())
			var pvcs corev1.PersistentVolumeClaimList
			g.Expect(k8s.List(ctx(), &pvcs, client.InNamespace(ns), client.MatchingLabels{ftv1.LabelPair: "cache"})).To(Succeed())
			g.Expect(pvcs.Items).To(BeEmpty())
		}).WithTimeout(recoveryTimeout).WithPolling(poll).Should(Succeed())
		Expect(membersPerNode()).To(BeEmpty(), "no member anywhere counts against a node's limit")
	})

	It("converges to the same end state when the operator is killed in the middle of a failover", func() {
		ns := newNamespace()
		newFTVM(ns, "erp")
		before := waitProtected(ns, "erp")
		lost, survivor := before.Status.Primary.Node, before.Status.Secondary.Node

		cluster("stop", "kubevirt-double")
		DeferCleanup(cluster, "start", "kubevirt-double")
		killNode(lost)
		awaitFailoverCount(ns, "erp", 1)
		Eventually(func(g Gomega) {
			g.Expect(getFTVM(ns, "erp").Status.Secondary).NotTo(BeNil(), "a new secondary was created")
		}).WithTimeout(recoveryTimeout).WithPolling(poll).Should(Succeed())

		By("killing the operator (SIGKILL) mid-failover and starting it again")
		cluster("kill", "operator")
		cluster("start", "operator")
		cluster("start", "kubevirt-double")

		Eventually(func(g Gomega) { expectPairHealthy(g, ns, "erp", lost) }).
			WithTimeout(recoveryTimeout).WithPolling(poll).Should(Succeed())
		f := getFTVM(ns, "erp")
		Expect(f.Status.Primary.Node).To(Equal(survivor))
		Expect(f.Status.FailoverCount).To(Equal(int32(1)), "the restarted operator did not fail over again")
		Consistently(func(g Gomega) {
			g.Expect(members(ns, "erp")).To(HaveLen(2), "no extra member was started")
		}).WithTimeout(5 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
	})

	// kubectl drain as an administrator runs it. The KubeVirt double intercepts the eviction of a
	// launcher pod as virt-api does (429, and the VMI marked for evacuation); lockstep moves the
	// member, its VMI and pod go, and the drain completes. (The full stack drains a primary's node,
	// with its client checking every reply.)
	It("kubectl drain completes on a secondary's node, and waits, saying why, where no node can take the member", func() {
		ns := newNamespace()
		newFTVM(ns, "drained")
		before := waitProtected(ns, "drained")
		drain := func(node string, timeout time.Duration) (string, error) {
			return lc.Kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout="+timeout.String())
		}
		uncordon := func(nodes ...string) {
			for _, n := range nodes {
				_, err := lc.Kubectl("uncordon", n)
				Expect(err).NotTo(HaveOccurred())
			}
		}

		DeferCleanup(func() { uncordon(nodeNames(6)...) }) // whatever the spec leaves cordoned
		By("draining the secondary's node: the secondary moves, the primary stays")
		out, err := drain(before.Status.Secondary.Node, 3*time.Minute)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("Eviction triggered evacuation of VMI"), "KubeVirt refused the eviction and evacuated instead")
		Expect(out).To(ContainSubstring("drained"))
		after := waitProtected(ns, "drained")
		Expect(after.Status.Primary.UID).To(Equal(before.Status.Primary.UID))
		Expect(after.Status.Secondary.Node).NotTo(Equal(before.Status.Secondary.Node))
		uncordon(before.Status.Secondary.Node)

		By("no node can take the secondary: every other node cordoned; the drain waits, and the FaultTolerantVM says why")
		for _, n := range nodeNames(6) {
			if n != after.Status.Primary.Node && n != after.Status.Secondary.Node {
				_, err := lc.Kubectl("cordon", n)
				Expect(err).NotTo(HaveOccurred())
			}
		}
		out, err = drain(after.Status.Secondary.Node, 12*time.Second) // two tries: kubectl drain retries every 5 s
		Expect(err).To(HaveOccurred(), "the drain cannot complete\n%s", out)
		Expect(out).To(ContainSubstring("Evacuation in progress"), "kubectl drain retried the eviction")
		Eventually(func() string { return eventMessages(ns, "drained", ftv1.ReasonEvacuationWaiting) }).
			WithTimeout(recoveryTimeout).WithPolling(poll).Should(ContainSubstring("no other node can take the VM's next secondary"))
		still := getFTVM(ns, "drained")
		Expect(still.Status.State).To(Equal(ftv1.StateProtected), "the VM stays protected where it is")
		Expect(still.Status.Secondary.UID).To(Equal(after.Status.Secondary.UID))
	})

	It("rejects invalid FaultTolerantVMs with clear messages and leaves running ones alone", func() {
		ns := newNamespace()
		newFTVM(ns, "good")
		waitProtected(ns, "good")
		noMemory := ftvm(ns, "no-memory")
		noMemory.Spec.Template.Spec.Domain.Memory = nil
		badStrategy := ftvm(ns, "bad-strategy")
		badStrategy.Spec.RunStrategy = "Sometimes"
		gpu := ftvm(ns, "gpu")
		gpu.Spec.Template.Spec.Domain.Devices.GPUs = []virtv1.GPU{{Name: "g", DeviceName: "nvidia.com/A100"}}
		badNetwork := ftvm(ns, "bad-network")
		badNetwork.Spec.LoggingNetwork.Name = "Not_A_Name"
		for _, c := range []struct {
			f    *ftv1.FaultTolerantVM
			want string
		}{
			{noMemory, "memory"},
			{badStrategy, "Sometimes"},
			{gpu, "GPU"},
			{badNetwork, "loggingNetwork"},
		} {
			err := k8s.Create(ctx(), c.f)
			Expect(err).To(HaveOccurred(), c.f.Name)
			Expect(err.Error()).To(ContainSubstring(c.want), c.f.Name)
			GinkgoWriter.Printf("%s rejected: %v\n", c.f.Name, err)
		}

		By("a spec the schema accepts but lockstep's webhook refuses: a logging network that does not exist")
		missing := ftvm(ns, "missing-network")
		missing.Spec.LoggingNetwork.Name = "no-such-network"
		err := k8s.Create(ctx(), missing)
		Expect(err).To(MatchError(ContainSubstring(`admission webhook "vfaulttolerantvm.ft.lockstep.dev" denied the request`)))
		Expect(err).To(MatchError(ContainSubstring("no-such-network: create it first, or give spec.loggingNetwork.config")))

		Consistently(func(g Gomega) { expectPairHealthy(g, ns, "good") }).
			WithTimeout(3 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
	})
})

// awaitFailoverCount waits until the FaultTolerantVM has failed over n times, and returns when
// that was seen.
func awaitFailoverCount(ns, name string, n int32) time.Time {
	EventuallyWithOffset(1, func(g Gomega) {
		g.Expect(getFTVM(ns, name).Status.FailoverCount).To(Equal(n))
	}).WithTimeout(recoveryTimeout).WithPolling(poll).Should(Succeed())
	return time.Now()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
