package controllers_test

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// Day-2 operations: spec.protection (vSphere FT's Turn Off / Turn On and Suspend / Resume) and
// FaultTolerantVMOperations (test failover, test restart of the secondary, migrate the secondary).
var _ = Describe("Day-2 operations", func() {
	var ns string
	var before *ftv1.FaultTolerantVM

	BeforeEach(func() {
		ns = newNamespace()
		for i := 1; i <= 4; i++ {
			makeNode(fmt.Sprintf("node-%d", i), "zone-a")
		}
		Expect(k8s.Create(ctx(), newFTVM(ns, "vm"))).To(Succeed())
		before = waitForState(ns, "vm", ftv1.StateProtected)
	})
	AfterEach(func() {
		deleteAllFTVMs(ns)
		deleteAllNodes()
	})

	record := func() *coordinationv1.Lease {
		l := &coordinationv1.Lease{}
		Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: ftv1.RecordName("vm")}, l)).To(Succeed())
		return l
	}

	Context("spec.protection", func() {
		It("Suspended stops the secondary, keeps its node reserved, and Enabled protects the VM there again", func() {
			setProtection(ns, "vm", ftv1.ProtectionSuspended)
			Eventually(isGone(ns, before.Status.Secondary.VMI), timeout, interval).Should(BeTrue())
			got := waitFor(ns, "vm", "unprotected by choice", func(f *ftv1.FaultTolerantVM) bool {
				c := condition(f, ftv1.ConditionProtected)
				return f.Status.Secondary == nil && c != nil && c.Reason == ftv1.ReasonProtectionSuspended
			})
			Expect(got.Status.State).To(Equal(ftv1.StateNotProtected))
			Expect(got.Status.Primary.VMI).To(Equal(before.Status.Primary.VMI), "the primary runs on")
			Expect(condition(got, ftv1.ConditionProtected).Message).To(ContainSubstring("node " + before.Status.Secondary.Node + " stays reserved"))
			Expect(condition(got, ftv1.ConditionSecondaryReady).Reason).To(Equal(ftv1.ReasonProtectionSuspended))
			Expect(record().Annotations).To(HaveKeyWithValue(ftv1.AnnotationReservedNode, before.Status.Secondary.Node))
			Consistently(func() int { return len(members(ns, "vm")) }, "2s", interval).Should(Equal(1), "no secondary while suspended")
			Expect(eventReasons(ns, "vm")).To(ContainElement(ftv1.ReasonProtectionSuspended))

			By("a new pair cannot take the reserved room: one member per node, and one free node")
			reserved := before.Status.Secondary.Node
			free := []string{}
			for i := 1; i <= 4; i++ {
				n := nodeName(fmt.Sprintf("node-%d", i))
				setNodeMaxVMs(n, 1)
				if n != reserved && n != before.Status.Primary.Node {
					free = append(free, n)
				}
			}
			cordon(free[1])
			Expect(k8s.Create(ctx(), newFTVM(ns, "other"))).To(Succeed())
			waitFor(ns, "other", "a primary, and no node for its secondary", func(f *ftv1.FaultTolerantVM) bool {
				c := condition(f, ftv1.ConditionSecondaryReady)
				return f.Status.Primary != nil && c != nil && c.Reason == ftv1.ReasonNoEligibleNode
			})
			Consistently(func() []string { return nodesOf(ns, "other") }, "2s", interval).ShouldNot(ContainElement(reserved))

			By("resuming: the secondary returns to its reserved node, and the reservation ends")
			setProtection(ns, "vm", ftv1.ProtectionEnabled)
			after := waitFor(ns, "vm", "protected again", func(f *ftv1.FaultTolerantVM) bool {
				return f.Status.State == ftv1.StateProtected && f.Status.Secondary != nil
			})
			Expect(after.Status.Secondary.Node).To(Equal(reserved))
			Expect(after.Status.Primary.VMI).To(Equal(before.Status.Primary.VMI))
			Expect(after.Status.FailoverCount).To(BeZero())
			Eventually(func() map[string]string { return record().Annotations }, timeout, interval).ShouldNot(HaveKey(ftv1.AnnotationReservedNode))
		})

		It("Disabled stops the secondary and reserves nothing; Enabled protects the VM again", func() {
			setProtection(ns, "vm", ftv1.ProtectionDisabled)
			got := waitFor(ns, "vm", "protection off", func(f *ftv1.FaultTolerantVM) bool {
				c := condition(f, ftv1.ConditionProtected)
				return f.Status.Secondary == nil && c != nil && c.Reason == ftv1.ReasonProtectionDisabled
			})
			Expect(got.Status.State).To(Equal(ftv1.StateNotProtected))
			Expect(record().Annotations).NotTo(HaveKey(ftv1.AnnotationReservedNode))
			Consistently(func() int { return len(members(ns, "vm")) }, "2s", interval).Should(Equal(1))

			setProtection(ns, "vm", ftv1.ProtectionEnabled)
			after := waitForState(ns, "vm", ftv1.StateProtected)
			Expect(after.Status.Primary.VMI).To(Equal(before.Status.Primary.VMI))
			Expect(after.Status.Secondary.UID).NotTo(Equal(before.Status.Secondary.UID), "a new secondary (its name may be used again)")
		})
	})

	Context("FaultTolerantVMOperations", func() {
		It("TestFailover promotes the secondary over the running primary, once, and starts a new secondary", func() {
			op := newOperation(ns, "failover", ftv1.OperationTestFailover, "")
			done := waitForOperation(ns, "failover", ftv1.OperationSucceeded)
			Expect(done.Status.Primary.VMI).To(Equal(before.Status.Primary.VMI))
			Expect(done.Status.Secondary.VMI).To(Equal(before.Status.Secondary.VMI))
			Expect(done.Status.Result.Primary.VMI).To(Equal(before.Status.Secondary.VMI))
			Expect(done.Status.Result.Secondary.VMI).NotTo(BeElementOf(before.Status.Primary.VMI, before.Status.Secondary.VMI))
			Expect(done.Status.StartTime).NotTo(BeNil())
			Expect(done.Status.CompletionTime).NotTo(BeNil())
			Expect(done.Status.Message).To(ContainSubstring("took over from " + before.Status.Primary.VMI))

			after := getFTVM(ns, "vm")
			Expect(after.Status.State).To(Equal(ftv1.StateProtected))
			Expect(after.Status.FailoverCount).To(Equal(int32(1)))
			Expect(after.Status.Epoch).To(Equal(before.Status.Epoch + 1))
			Expect(isGone(ns, before.Status.Primary.VMI)()).To(BeTrue())
			Expect(record().Annotations).To(HaveKeyWithValue(ftv1.AnnotationOperation, string(op.UID)))
			Expect(eventReasons(ns, "vm")).To(ContainElements(ftv1.ReasonPromoted, "TestFailoverSucceeded"))

			By("a finished operation is never done again")
			Consistently(func() int32 { return getFTVM(ns, "vm").Status.FailoverCount }, "2s", interval).Should(Equal(int32(1)))
		})

		It("TestRestartSecondary replaces the secondary and keeps the primary", func() {
			newOperation(ns, "restart", ftv1.OperationTestRestartSecondary, "")
			done := waitForOperation(ns, "restart", ftv1.OperationSucceeded)
			Expect(done.Status.Result.Primary.VMI).To(Equal(before.Status.Primary.VMI))
			Expect(done.Status.Secondary.UID).To(Equal(before.Status.Secondary.UID))
			Expect(done.Status.Result.Secondary.UID).NotTo(Equal(before.Status.Secondary.UID))
			Expect(getFTVM(ns, "vm").Status.FailoverCount).To(BeZero())
		})

		It("MigrateSecondary moves the secondary to the node asked for", func() {
			target := ""
			for i := 1; i <= 4; i++ {
				if n := nodeName(fmt.Sprintf("node-%d", i)); n != before.Status.Primary.Node && n != before.Status.Secondary.Node {
					target = n
				}
			}
			newOperation(ns, "migrate", ftv1.OperationMigrateSecondary, target)
			done := waitForOperation(ns, "migrate", ftv1.OperationSucceeded)
			Expect(done.Status.Result.Secondary.Node).To(Equal(target))
			Expect(done.Status.Result.Primary.VMI).To(Equal(before.Status.Primary.VMI))
		})

		It("MigrateSecondary to a node that a stopped member of the pair has not left yet waits for it", func() {
			By("a secondary stopped by a restart lingers on its node (a finalizer holds its VMI)")
			old := before.Status.Secondary
			holdVMI(ns, old.VMI, true)
			DeferCleanup(holdVMI, ns, old.VMI, false) // also when the spec fails
			newOperation(ns, "restart", ftv1.OperationTestRestartSecondary, "")
			waitForOperation(ns, "restart", ftv1.OperationSucceeded)
			vmi, err := getVMI(ns, old.VMI)
			Expect(err).NotTo(HaveOccurred())
			Expect(vmi.DeletionTimestamp).NotTo(BeNil())

			By("a migration to that node waits, and says for what")
			newOperation(ns, "migrate", ftv1.OperationMigrateSecondary, old.Node)
			Eventually(func() string { return getOperation(ns, "migrate").Status.Message }, timeout, interval).
				Should(ContainSubstring("node " + old.Node + " still holds a member of this pair that is being deleted"))
			Consistently(func() ftv1.OperationPhase { return getOperation(ns, "migrate").Status.Phase }, "2s", interval).
				Should(Equal(ftv1.OperationRunning))

			By("once the stopped member is gone, the new secondary starts there")
			holdVMI(ns, old.VMI, false)
			done := waitForOperation(ns, "migrate", ftv1.OperationSucceeded)
			Expect(done.Status.Result.Secondary.Node).To(Equal(old.Node))
			Expect(done.Status.Result.Primary.VMI).To(Equal(before.Status.Primary.VMI))
		})

		It("refuses to migrate the secondary onto the primary's node, and changes nothing", func() {
			newOperation(ns, "bad", ftv1.OperationMigrateSecondary, before.Status.Primary.Node)
			failed := waitForOperation(ns, "bad", ftv1.OperationFailed)
			Expect(failed.Status.Message).To(ContainSubstring("never share a node"))
			after := getFTVM(ns, "vm")
			Expect(after.Status.Secondary.VMI).To(Equal(before.Status.Secondary.VMI))
			Expect(after.Status.Primary.VMI).To(Equal(before.Status.Primary.VMI))
		})

		It("runs one operation at a time, oldest first, and waits while the VM is unprotected", func() {
			setProtection(ns, "vm", ftv1.ProtectionDisabled)
			waitFor(ns, "vm", "protection off", func(f *ftv1.FaultTolerantVM) bool { return f.Status.Secondary == nil })
			newOperation(ns, "first", ftv1.OperationTestRestartSecondary, "")
			newOperation(ns, "second", ftv1.OperationTestFailover, "")
			Eventually(func(g Gomega) {
				g.Expect(getOperation(ns, "first").Status.Message).To(ContainSubstring("protection Disabled"))
				g.Expect(getOperation(ns, "second").Status.Message).To(Equal("waiting for operation first"))
			}, timeout, interval).Should(Succeed())
			Expect(getOperation(ns, "first").Status.Phase).To(Equal(ftv1.OperationPending))

			setProtection(ns, "vm", ftv1.ProtectionEnabled)
			waitForOperation(ns, "first", ftv1.OperationSucceeded)
			second := waitForOperation(ns, "second", ftv1.OperationSucceeded)
			Expect(second.Status.StartTime.Time).NotTo(BeTemporally("<", getOperation(ns, "first").Status.CompletionTime.Time))
		})

		It("waits for a FaultTolerantVM that does not exist yet, and starts once it does", func() {
			op := &ftv1.FaultTolerantVMOperation{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "early"},
				Spec:       ftv1.FaultTolerantVMOperationSpec{FaultTolerantVMName: "later", Type: ftv1.OperationTestRestartSecondary},
			}
			Expect(k8s.Create(ctx(), op)).To(Succeed())
			Eventually(func() string { return getOperation(ns, "early").Status.Message }, timeout, interval).
				Should(Equal("waiting: FaultTolerantVM later does not exist"))
			Expect(getOperation(ns, "early").Status.Phase).To(Equal(ftv1.OperationPending))
			Expect(k8s.Create(ctx(), newFTVM(ns, "later"))).To(Succeed())
			waitForOperation(ns, "early", ftv1.OperationSucceeded)
		})

		It("refuses a change to an operation's spec, and node for other types, at admission", func() {
			err := k8s.Create(ctx(), &ftv1.FaultTolerantVMOperation{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nodeful"},
				Spec:       ftv1.FaultTolerantVMOperationSpec{FaultTolerantVMName: "vm", Type: ftv1.OperationTestFailover, Node: "x"},
			})
			Expect(err).To(MatchError(ContainSubstring("node is only for MigrateSecondary")))
			op := newOperation(ns, "fixed", ftv1.OperationTestRestartSecondary, "")
			base := op.DeepCopy()
			op.Spec.Type = ftv1.OperationTestFailover
			Expect(k8s.Patch(ctx(), op, client.MergeFrom(base))).To(MatchError(ContainSubstring("an operation's spec cannot change")))
			waitForOperation(ns, "fixed", ftv1.OperationSucceeded)
		})
	})
	// Drains: kubectl drain cordons the node, and KubeVirt's virt-api answers the eviction of a
	// member's launcher pod (evictionStrategy External) by marking the VMI with the node in
	// status.evacuationNodeName, which drain() does here as virt-api would.
	Context("Drains", func() {
		It("move a secondary off the drained node: a new secondary elsewhere, the primary untouched", func() {
			drained := before.Status.Secondary.Node
			drain(ns, before.Status.Secondary.VMI, drained)
			op := waitForOperation(ns, before.Status.Secondary.VMI+"-evacuation", ftv1.OperationSucceeded)
			Expect(op.Spec.Type).To(Equal(ftv1.OperationMigrateSecondary))
			Expect(op.Labels).To(HaveKeyWithValue(ftv1.LabelEvacuation, drained))
			Eventually(isGone(ns, before.Status.Secondary.VMI), timeout, interval).Should(BeTrue(), "the drain goes on once the member's VMI is gone")
			after := waitForState(ns, "vm", ftv1.StateProtected)
			Expect(after.Status.Secondary.Node).NotTo(Equal(drained))
			Expect(after.Status.Primary.VMI).To(Equal(before.Status.Primary.VMI))
			Expect(after.Status.FailoverCount).To(BeZero())
			Expect(eventReasons(ns, "vm")).To(ContainElement(ftv1.ReasonEvacuating))
		})

		It("hand the VM over from a primary on the drained node to its synchronized secondary, then protect it elsewhere", func() {
			drained := before.Status.Primary.Node
			drain(ns, before.Status.Primary.VMI, drained)
			op := waitForOperation(ns, before.Status.Primary.VMI+"-evacuation", ftv1.OperationSucceeded)
			Expect(op.Spec.Type).To(Equal(ftv1.OperationTestFailover))
			Expect(op.Status.Result.Primary.VMI).To(Equal(before.Status.Secondary.VMI))
			Eventually(isGone(ns, before.Status.Primary.VMI), timeout, interval).Should(BeTrue(), "the drain goes on once the member's VMI is gone")
			after := waitForState(ns, "vm", ftv1.StateProtected)
			Expect(after.Status.Primary.VMI).To(Equal(before.Status.Secondary.VMI))
			Expect(after.Status.Secondary.Node).NotTo(Equal(drained))
			Expect(after.Status.FailoverCount).To(Equal(int32(1)))
		})

		It("keep a member where it is while no other node could take the next secondary: the drain waits, and an event says why", func() {
			var free []string
			for i := 1; i <= 4; i++ {
				if n := nodeName(fmt.Sprintf("node-%d", i)); n != before.Status.Primary.Node && n != before.Status.Secondary.Node {
					free = append(free, n)
					cordon(n)
				}
			}
			drain(ns, before.Status.Secondary.VMI, before.Status.Secondary.Node)
			Eventually(func() []string { return eventReasons(ns, "vm") }, timeout, interval).Should(ContainElement(ftv1.ReasonEvacuationWaiting))
			Consistently(isGone(ns, before.Status.Secondary.VMI), "2s", interval).Should(BeFalse(), "the secondary stays while nothing could replace it")
			Expect(apierrors.IsNotFound(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: before.Status.Secondary.VMI + "-evacuation"},
				&ftv1.FaultTolerantVMOperation{}))).To(BeTrue(), "no operation yet")

			By("a node freed, the secondary moves there")
			uncordon(free[0])
			waitForOperation(ns, before.Status.Secondary.VMI+"-evacuation", ftv1.OperationSucceeded)
			Expect(waitForState(ns, "vm", ftv1.StateProtected).Status.Secondary.Node).To(Equal(free[0]))
		})

		It("keep a member whose pair is not Protected where it is: the drain waits, and the operation says why", func() {
			setProtection(ns, "vm", ftv1.ProtectionDisabled)
			waitFor(ns, "vm", "protection off", func(f *ftv1.FaultTolerantVM) bool { return f.Status.Secondary == nil })
			drain(ns, before.Status.Primary.VMI, before.Status.Primary.Node)
			name := before.Status.Primary.VMI + "-evacuation"
			Eventually(func(g Gomega) {
				op := &ftv1.FaultTolerantVMOperation{}
				g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: name}, op)).To(Succeed())
				g.Expect(op.Status.Message).To(ContainSubstring("protection Disabled"))
			}, timeout, interval).Should(Succeed())
			Consistently(isGone(ns, before.Status.Primary.VMI), "2s", interval).Should(BeFalse(), "the VM's only copy stays")
			Expect(getOperation(ns, name).Status.Phase).To(Equal(ftv1.OperationPending))

			By("protected again, the pair is moved off the node")
			setProtection(ns, "vm", ftv1.ProtectionEnabled)
			waitForOperation(ns, name, ftv1.OperationSucceeded)
			Eventually(isGone(ns, before.Status.Primary.VMI), timeout, interval).Should(BeTrue())
		})
	})
})

func newOperation(ns, name string, typ ftv1.OperationType, node string) *ftv1.FaultTolerantVMOperation {
	GinkgoHelper()
	op := &ftv1.FaultTolerantVMOperation{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       ftv1.FaultTolerantVMOperationSpec{FaultTolerantVMName: "vm", Type: typ, Node: node},
	}
	Expect(k8s.Create(ctx(), op)).To(Succeed())
	return op
}

func getOperation(ns, name string) *ftv1.FaultTolerantVMOperation {
	GinkgoHelper()
	op := &ftv1.FaultTolerantVMOperation{}
	Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: name}, op)).To(Succeed())
	return op
}

func waitForOperation(ns, name string, phase ftv1.OperationPhase) *ftv1.FaultTolerantVMOperation {
	GinkgoHelper()
	var op *ftv1.FaultTolerantVMOperation
	Eventually(func(g Gomega) {
		op = &ftv1.FaultTolerantVMOperation{}
		g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: name}, op)).To(Succeed())
		g.Expect(op.Status.Phase).To(Equal(phase), "message: %s", op.Status.Message)
	}, timeout, interval).Should(Succeed())
	return op
}

func setNodeMaxVMs(name string, n int) {
	GinkgoHelper()
	node := &corev1.Node{}
	Expect(k8s.Get(ctx(), types.NamespacedName{Name: name}, node)).To(Succeed())
	base := node.DeepCopy()
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[ftv1.AnnotationNodeMaxVMs] = fmt.Sprint(n)
	Expect(k8s.Patch(ctx(), node, client.MergeFrom(base))).To(Succeed())
}

func cordon(name string)   { setUnschedulable(name, true) }
func uncordon(name string) { setUnschedulable(name, false) }

func setUnschedulable(name string, unschedulable bool) {
	GinkgoHelper()
	node := &corev1.Node{}
	Expect(k8s.Get(ctx(), types.NamespacedName{Name: name}, node)).To(Succeed())
	base := node.DeepCopy()
	node.Spec.Unschedulable = unschedulable
	Expect(k8s.Patch(ctx(), node, client.MergeFrom(base))).To(Succeed())
}

// nodesOf lists the nodes of a FaultTolerantVM's members.
func nodesOf(ns, name string) []string {
	out := []string{}
	for _, v := range members(ns, name) {
		out = append(out, v.Labels[ftv1.LabelNode])
	}
	return out
}

// holdVMI adds (or removes) a finalizer of the test's own on a VMI, so that a deleted member stays
// on its node, being deleted, as KubeVirt keeps one while its launcher shuts the VM down.
func holdVMI(ns, name string, hold bool) {
	const finalizer = "test.lockstep.dev/hold"
	vmi, err := getVMI(ns, name)
	if !hold && apierrors.IsNotFound(err) {
		return
	}
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	base := vmi.DeepCopy()
	if hold {
		controllerutil.AddFinalizer(vmi, finalizer)
	} else {
		controllerutil.RemoveFinalizer(vmi, finalizer)
	}
	ExpectWithOffset(1, k8s.Patch(ctx(), vmi, client.MergeFrom(base))).To(Succeed())
}

// drain does what kubectl drain and KubeVirt's virt-api do to a member's node: cordon it, and
// mark the member's VMI for evacuation from it.
func drain(ns, vmiName, node string) {
	GinkgoHelper()
	cordon(node)
	vmi := &virtv1.VirtualMachineInstance{}
	Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: vmiName}, vmi)).To(Succeed())
	base := vmi.DeepCopy()
	vmi.Status.EvacuationNodeName = node
	Expect(k8s.Patch(ctx(), vmi, client.MergeFrom(base))).To(Succeed())
}
