package controllers_test

import (
	"fmt"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/controllers"
	"github.com/lockstep-dev/lockstep/internal/member"
)

// makeLockstepdNodes makes n nodes where lockstepd runs: it published its logging address (a
// lockstepd without a node lease counts by its address, as one from before the lease did).
func makeLockstepdNodes(n int) {
	GinkgoHelper()
	for i := 1; i <= n; i++ {
		name := makeNode(fmt.Sprintf("node-%d", i), "zone-a")
		node := &corev1.Node{}
		Expect(k8s.Get(ctx(), types.NamespacedName{Name: name}, node)).To(Succeed())
		base := node.DeepCopy()
		node.Annotations = map[string]string{ftv1.AnnotationNodeLoggingAddress: fmt.Sprintf("10.0.0.%d:7410", i)}
		Expect(k8s.Patch(ctx(), node, client.MergeFrom(base))).To(Succeed())
	}
}

// Under --colo a secondary's images must be exactly its primary's disks, whose sizes only
// lockstepd knows once the primary runs (CDI and KubeVirt size them from the claims, differently).
var _ = Describe("A new pair under --colo", func() {
	It("starts its primary alone, with only its own name handed out, until lockstepd measured its disks; then its secondary, sized from them", func() {
		operator.stop()
		DeferCleanup(func() { operator = startOperator() })
		colo := startOperatorWith(nil, func(c *controllers.Config) { c.Member.COLO.Enabled = true })
		DeferCleanup(colo.stop)

		ns := newNamespace()
		makeLockstepdNodes(3)
		f := newDiskFTVM(ns)
		Expect(k8s.Create(ctx(), f)).To(Succeed())
		lastOrdinal := func() string {
			l := &coordinationv1.Lease{}
			if err := k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: ftv1.RecordName("vm")}, l); err != nil {
				return err.Error()
			}
			return l.Annotations[ftv1.AnnotationLastOrdinal]
		}
		memberNames := func() []string {
			var out []string
			for _, m := range members(ns, "vm") {
				out = append(out, m.Name)
			}
			slices.Sort(out)
			return out
		}

		By("the primary runs alone; the secondary waits for its sizes")
		waiting := waitFor(ns, "vm", "the secondary waiting for the primary's disk sizes", func(f *ftv1.FaultTolerantVM) bool {
			c := condition(f, ftv1.ConditionSecondaryReady)
			return c != nil && c.Reason == ftv1.ReasonWaitingForDiskSizes
		})
		Expect(condition(waiting, ftv1.ConditionSecondaryReady).Message).To(ContainSubstring("vm-1"))
		Expect(waiting.Status.State).To(Equal(ftv1.StateStarting))
		Consistently(memberNames, 2*time.Second, interval).Should(Equal([]string{"vm-1"}))
		Expect(lastOrdinal()).To(Equal("1"), "only the primary's name is handed out")
		primary, err := getVMI(ns, "vm-1")
		Expect(err).NotTo(HaveOccurred())
		Expect(primary.Labels[ftv1.LabelRole]).To(Equal(ftv1.RolePrimary))

		By("lockstepd measures the primary's disk: CDI imported it at 1Gi less 5.5%, in whole MiB")
		const measured = 967 << 20
		base := primary.DeepCopy()
		primary.Annotations[ftv1.AnnotationMeasuredDiskBytes] = fmt.Sprintf("root=%d", measured)
		Expect(k8s.Patch(ctx(), primary, client.MergeFrom(base))).To(Succeed())

		Eventually(memberNames, timeout, interval).Should(Equal([]string{"vm-1", "vm-2"}))
		secondary, err := getVMI(ns, "vm-2")
		Expect(err).NotTo(HaveOccurred())
		Expect(secondary.Labels[ftv1.LabelRole]).To(Equal(ftv1.RoleSecondary))
		Expect(secondary.Annotations[ftv1.AnnotationDiskBytes]).To(Equal(fmt.Sprintf("root=%d", measured)))
		copyOf := &corev1.PersistentVolumeClaim{}
		Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm-2-root"}, copyOf)).To(Succeed())
		want := member.CopyRequest(measured, resource.MustParse("1Gi"))
		asked := copyOf.Spec.Resources.Requests[corev1.ResourceStorage]
		Expect(asked.Cmp(want)).To(Equal(0), "the copy asks for %s, want %s", asked.String(), want.String())
		Expect(copyOf.Annotations[ftv1.AnnotationDiskBytes]).To(Equal(fmt.Sprint(measured)))
		Eventually(lastOrdinal, timeout, interval).Should(Equal("2"))
		deleteAllFTVMs(ns)
		deleteAllNodes()
		expectNothingLeft()
	})
})
