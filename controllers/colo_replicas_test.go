package controllers_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/controllers"
)

// Under --colo a secondary's copies hold its replicas of the primary's disks once it was
// synchronized; the next secondary of the same primary takes them over where they are, and the
// primary's engine copies only what the VM wrote since (replicas.go).

func withCOLO(c *controllers.Config) { c.Member.COLO.Enabled = true }

// coloDiskBytes is the size lockstepd measures for the primary's disk in these specs.
const coloDiskBytes = 967 << 20

// setupCOLODiskPair makes four nodes where lockstepd runs, and a Protected pair under --colo
// whose VM has a persistent disk: the test does what lockstepd does (it measures the primary's
// disk and marks the secondary synchronized).
func setupCOLODiskPair(ns string) pairBefore {
	GinkgoHelper()
	makeLockstepdNodes(4)
	f := newDiskFTVM(ns)
	Expect(k8s.Create(ctx(), f)).To(Succeed())
	patchVMIAnnotationWhenRunning(ns, "vm-1", ftv1.AnnotationMeasuredDiskBytes, fmt.Sprintf("root=%d", coloDiskBytes))
	patchVMIAnnotationWhenRunning(ns, "vm-2", ftv1.AnnotationSyncedAt, time.Now().UTC().Format(time.RFC3339))
	// lockstepd on the primary's node reports the resync into vm-2: its engine's dirty bitmaps
	// count from vm-2's replicas.
	Eventually(func() error {
		f := getFTVM(ns, "vm")
		base := f.DeepCopy()
		f.Status.LastResync = &ftv1.LastResyncStatus{Secondary: "vm-2", CopiedBytes: ptr.To(int64(coloDiskBytes)),
			DurationMilliseconds: ptr.To(int64(1000)), CompletionTime: &metav1.Time{Time: time.Now()}}
		return k8s.Status().Patch(ctx(), f, client.MergeFrom(base))
	}, timeout, interval).Should(Succeed())
	got := waitFor(ns, "vm", "Protected, the secondary's copy noted as holding its replica", func(f *ftv1.FaultTolerantVM) bool {
		return f.Status.State == ftv1.StateProtected && f.Status.Secondary != nil && copyAnnotation(ns, "vm-2-root", ftv1.AnnotationReplicaOf) == "vm-2"
	})
	return pairBefore{primary: *got.Status.Primary, secondary: *got.Status.Secondary}
}

// coloPairAlone replaces the suite's operator with one under --colo for the spec, and makes a
// Protected pair (setupCOLODiskPair) in a namespace of its own.
func coloPairAlone() (string, pairBefore) {
	GinkgoHelper()
	operator.stop()
	DeferCleanup(func() { operator = startOperator() })
	colo := startOperatorWith(nil, withCOLO)
	DeferCleanup(colo.stop)
	ns := newNamespace()
	return ns, setupCOLODiskPair(ns)
}

// cleanUp deletes what a spec made and checks that nothing is left.
func cleanUp(ns string) {
	GinkgoHelper()
	deleteAllFTVMs(ns)
	deleteAllNodes()
	expectNothingLeft()
}

// patchVMIAnnotationWhenRunning sets an annotation of a member once it runs, as lockstepd does.
func patchVMIAnnotationWhenRunning(ns, name, key, value string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		vmi, err := getVMI(ns, name)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(vmi.Status.Phase).To(Equal(virtv1.Running))
		base := vmi.DeepCopy()
		vmi.Annotations[key] = value
		g.Expect(k8s.Patch(ctx(), vmi, client.MergeFrom(base))).To(Succeed())
	}, timeout, interval).Should(Succeed())
}

func copyAnnotation(ns, name, key string) string {
	c := &corev1.PersistentVolumeClaim{}
	if err := k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: name}, c); err != nil {
		return ""
	}
	return c.Annotations[key]
}

func getCopy(ns, name string) *corev1.PersistentVolumeClaim {
	GinkgoHelper()
	c := &corev1.PersistentVolumeClaim{}
	Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: name}, c)).To(Succeed())
	return c
}

// deleteVMI deletes a member as lockstepd does when it fenced it.
func deleteVMI(ns, name string) {
	GinkgoHelper()
	vmi, err := getVMI(ns, name)
	Expect(err).NotTo(HaveOccurred())
	Expect(k8s.Delete(ctx(), vmi)).To(Succeed())
}

var _ = Describe("Under --colo, a secondary's copies", func() {
	AfterEach(func() { deleteAllNodes() })

	It("go to the next secondary of the same primary, on their node, and it converges from a crash after any write of the hand-over", func() {
		runCrashPath(crashPath{
			configure: withCOLO,
			setup:     setupCOLODiskPair,
			trigger: func(ns string, b pairBefore) {
				deleteVMI(ns, b.secondary.VMI) // lockstepd fenced it without its going live
				go func() {
					defer GinkgoRecover()
					// lockstepd marks the next secondary synchronized (a crash after the record's
					// write burns the name vm-3: it is vm-4 then).
					var next string
					Eventually(func() string { next = newSecondary(ns, b.secondary.VMI); return next }, 2*timeout, interval).ShouldNot(BeEmpty())
					patchVMIAnnotationWhenRunning(ns, next, ftv1.AnnotationSyncedAt, time.Now().UTC().Format(time.RFC3339))
				}()
			},
			check: func(ns string, b pairBefore) {
				expectWholePair(ns, b.primary.VMI, 0)
				Eventually(func(g Gomega) {
					name := newSecondary(ns, b.secondary.VMI)
					g.Expect(name).NotTo(BeEmpty())
					sec, err := getVMI(ns, name)
					g.Expect(err).NotTo(HaveOccurred())
					if sec.Annotations[ftv1.AnnotationReplicaOf] == "" {
						// A crash between handing the copy over and creating its secondary: the
						// copy's new member never ran, so it is not handed on; a blank one instead.
						g.Expect(claimsOf(sec)).To(Equal([]string{name + "-root"}))
						return
					}
					g.Expect(sec.Annotations).To(HaveKeyWithValue(ftv1.AnnotationReplicaOf, "vm-2"))
					g.Expect(sec.Labels[ftv1.LabelNode]).To(Equal(b.secondary.Node), "where the copies are")
					g.Expect(claimsOf(sec)).To(Equal([]string{"vm-2-root"}))
					c := getCopy(ns, "vm-2-root")
					g.Expect(c.Labels).To(HaveKeyWithValue(ftv1.LabelMember, name))
					g.Expect(c.Annotations).To(HaveKeyWithValue(ftv1.AnnotationOrdinal, name[len("vm-"):]))
					g.Expect(c.Annotations).To(HaveKeyWithValue(ftv1.AnnotationReplicaOf, name), "synchronized with it, the copy holds its replica")
				}, timeout, interval).Should(Succeed())
			},
			rows: []string{
				"update Lease ft-vm",                    // the name vm-3 handed out, before anything of it is made
				"patch PersistentVolumeClaim vm-2-root", // the copy handed to vm-3
				"create VirtualMachineInstance vm-3",    // on the copy's node, naming whose replica it holds
				status("FaultTolerantVM", "vm"),
				"patch PersistentVolumeClaim vm-2-root", // vm-3 synchronized: the copy holds its replica
				status("FaultTolerantVM", "vm"),
			},
		})
	})

	It("handed to a secondary that never synchronized are not handed on: the next one gets a blank copy", func() {
		ns, b := coloPairAlone()

		deleteVMI(ns, b.secondary.VMI)
		Eventually(func() string { return getVMIAnnotationOrEmpty(ns, "vm-3", ftv1.AnnotationReplicaOf) }, timeout, interval).Should(Equal("vm-2"))
		Expect(eventMessages(ns, "vm", ftv1.ReasonMemberCreated)).To(ContainSubstring("secondary vm-3 placed on node %s, with the copies of the disks that vm-2 left", b.secondary.Node))
		By("vm-3 never synchronizes (it cannot reach its primary), and lockstepd fences it")
		deleteVMI(ns, "vm-3")
		Eventually(func() error { _, err := getVMI(ns, "vm-4"); return err }, timeout, interval).Should(Succeed())
		sec, err := getVMI(ns, "vm-4")
		Expect(err).NotTo(HaveOccurred())
		Expect(sec.Annotations).NotTo(HaveKey(ftv1.AnnotationReplicaOf))
		Expect(claimsOf(sec)).To(Equal([]string{"vm-4-root"}))
		Expect(getCopy(ns, "vm-4-root").Annotations).NotTo(HaveKey(ftv1.AnnotationReplicaOf), "blank, until vm-4 is synchronized")
		By("the pair is whole again: the copy no member uses goes")
		Eventually(func() bool {
			c := &corev1.PersistentVolumeClaim{}
			err := k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm-2-root"}, c)
			return err != nil || c.DeletionTimestamp != nil
		}, timeout, interval).Should(BeTrue())
		cleanUp(ns)
	})
})

var _ = Describe("Under --colo, the next secondary", func() {
	It("gets blank copies when the primary's engine does not count from the last secondary's replicas", func() {
		ns, b := coloPairAlone()

		By("lockstepd on the primary's node restarted: it reports no resync (its engine tracks none)")
		f := getFTVM(ns, "vm")
		Expect(k8s.Status().Patch(ctx(), f, client.RawPatch(types.MergePatchType, []byte(`{"status":{"lastResync":null}}`)))).To(Succeed())
		Eventually(func() *ftv1.LastResyncStatus { return getFTVM(ns, "vm").Status.LastResync }, timeout, interval).Should(BeNil())
		deleteVMI(ns, b.secondary.VMI)
		Eventually(func() string { return newSecondary(ns, b.secondary.VMI) }, timeout, interval).Should(Equal("vm-3"))
		sec, err := getVMI(ns, "vm-3")
		Expect(err).NotTo(HaveOccurred())
		Expect(sec.Annotations).NotTo(HaveKey(ftv1.AnnotationReplicaOf))
		Expect(claimsOf(sec)).To(Equal([]string{"vm-3-root"}))
		cleanUp(ns)
	})

	It("waits for a dropped secondary's VMI to go, then takes over its copies", func() {
		ns, b := coloPairAlone()

		By("vm-2's VMI lingers while it is deleted (its launcher pod still stops)")
		vmi, err := getVMI(ns, b.secondary.VMI)
		Expect(err).NotTo(HaveOccurred())
		base := vmi.DeepCopy()
		vmi.Finalizers = append(vmi.Finalizers, "test.lockstep.dev/linger")
		Expect(k8s.Patch(ctx(), vmi, client.MergeFrom(base))).To(Succeed())
		deleteVMI(ns, b.secondary.VMI)
		waiting := waitFor(ns, "vm", "the secondary waiting for the copies", func(f *ftv1.FaultTolerantVM) bool {
			c := condition(f, ftv1.ConditionSecondaryReady)
			return c != nil && c.Reason == ftv1.ReasonWaitingForCopies
		})
		Expect(condition(waiting, ftv1.ConditionSecondaryReady).Message).To(ContainSubstring("vm-2, on node " + b.secondary.Node + ", is being deleted"))
		Consistently(func() string { return newSecondary(ns, b.secondary.VMI) }, 3*time.Second, interval).Should(BeEmpty())

		By("it goes: vm-3 takes its copies over")
		vmi, err = getVMI(ns, b.secondary.VMI)
		Expect(err).NotTo(HaveOccurred())
		base = vmi.DeepCopy()
		vmi.Finalizers = nil
		Expect(k8s.Patch(ctx(), vmi, client.MergeFrom(base))).To(Succeed())
		Eventually(func() string { return getVMIAnnotationOrEmpty(ns, "vm-3", ftv1.AnnotationReplicaOf) }, timeout, interval).Should(Equal("vm-2"))
		sec, err := getVMI(ns, "vm-3")
		Expect(err).NotTo(HaveOccurred())
		Expect(sec.Labels[ftv1.LabelNode]).To(Equal(b.secondary.Node))
		Expect(claimsOf(sec)).To(Equal([]string{"vm-2-root"}))
		cleanUp(ns)
	})
})

// newSecondary is the pair's secondary other than old, "" while there is none.
func newSecondary(ns, old string) string {
	for _, m := range members(ns, "vm") {
		if m.Name != old && m.Labels[ftv1.LabelRole] == ftv1.RoleSecondary && m.DeletionTimestamp == nil {
			return m.Name
		}
	}
	return ""
}

// claimsOf lists the claims a member's volumes name.
func claimsOf(vmi *virtv1.VirtualMachineInstance) []string {
	var out []string
	for _, v := range vmi.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			out = append(out, v.PersistentVolumeClaim.ClaimName)
		}
	}
	return out
}

func getVMIAnnotationOrEmpty(ns, name, key string) string {
	vmi, err := getVMI(ns, name)
	if err != nil {
		return ""
	}
	return vmi.Annotations[key]
}
