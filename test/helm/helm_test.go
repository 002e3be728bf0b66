//go:build helm

// Package helm installs, upgrades and uninstalls lockstep with Helm on a local cluster
// (hack/local-cluster.sh with INSTALL=helm): the chart's CRDs, RBAC, webhook configurations and
// certificate, priority class and Deployment are what the operator runs with. kwok runs no
// containers, so the operator runs as a process with the chart's Deployment's args, and the API
// server calls its webhooks on loopback (the chart's webhook.url).
//
//	make test-helm              # brings up the cluster "lockstep-helm", runs, tears it down
//	HELM_KEEP=1 make test-helm
package helm

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/test/localcluster"
)

const ns = "default"

var (
	lc  = localcluster.New("lockstep-helm", "HELM_KEEP", "INSTALL=helm")
	k8s client.Client
	up  bool
)

func TestHelm(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "lockstep Helm suite (local cluster)")
}

var _ = BeforeSuite(func() {
	By("bringing up the local cluster with 3 nodes, lockstep installed by helm upgrade --install")
	up = true
	Expect(lc.Up(3)).To(Succeed())
	c, err := lc.Client(0, 0)
	Expect(err).NotTo(HaveOccurred())
	k8s = c
	Expect(k8s.Create(context.Background(), localcluster.LoggingNetwork(ns))).To(Succeed())
})

var _ = AfterSuite(func() {
	if !up {
		return
	}
	msg, err := lc.End()
	GinkgoWriter.Println(msg)
	Expect(err).NotTo(HaveOccurred())
})

var _ = ReportAfterEach(func(r SpecReport) {
	if r.Failed() && up {
		for name, tail := range lc.Logs(80) {
			AddReportEntry(name+" (tail)", tail)
		}
	}
})

func helm(args ...string) string {
	out, err := lc.Run(append([]string{"helm"}, args...)...)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return out
}

func cluster(args ...string) {
	_, err := lc.Run(args...)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
}

var _ = Describe("lockstep installed with Helm", Ordered, func() {
	ctx := context.Background()

	It("helm install: the release is deployed, its webhooks answer, and a FaultTolerantVM is protected through it", func() {
		Expect(helm("status", "lockstep", "-n", "lockstep-system")).To(ContainSubstring("STATUS: deployed"))

		By("the chart's validating webhook refuses what FT cannot protect, with its message")
		bad := newFTVM("bad")
		bad.Spec.Template.Spec.Domain.Resources.OvercommitGuestOverhead = true
		err := k8s.Create(ctx, bad)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(SatisfyAll(ContainSubstring("admission webhook"), ContainSubstring("denied the request"),
			ContainSubstring("overcommitGuestOverhead")))

		Expect(k8s.Create(ctx, newFTVM("vm-1"))).To(Succeed())
		f := waitState("vm-1", ftv1.StateProtected)
		Expect(f.Spec.Protection).To(Equal(ftv1.ProtectionEnabled))
		Expect(f.Status.Primary.Node).NotTo(Equal(f.Status.Secondary.Node))
	})

	It("helm upgrade: the operator runs with the new values, and the protected VM is left alone", func() {
		before := memberVersions("vm-1")
		Expect(before).To(HaveLen(2))
		helm("upgrade", "lockstep", filepath.Join(lc.Root, "charts", "lockstep"), "-n", "lockstep-system", "--reuse-values",
			"--set", "ftLimits.maxVMsPerNode=1")
		Expect(helm("status", "lockstep", "-n", "lockstep-system")).To(ContainSubstring("REVISION: 2"))
		By("the rollout: the operator restarts with the Deployment's new args")
		cluster("stop", "operator")
		cluster("start", "operator")
		Consistently(func(g Gomega) {
			g.Expect(memberVersions("vm-1")).To(Equal(before), "the upgrade touched a running member")
			g.Expect(getFTVM("vm-1").Status.State).To(Equal(ftv1.StateProtected))
		}, 3*time.Second, 200*time.Millisecond).Should(Succeed())

		By("the new FT limit holds: one member per node, three nodes, so a second VM gets no secondary")
		Expect(k8s.Create(ctx, newFTVM("vm-2"))).To(Succeed())
		Eventually(func(g Gomega) {
			f := getFTVM("vm-2")
			c := apimeta.FindStatusCondition(f.Status.Conditions, ftv1.ConditionSecondaryReady)
			g.Expect(f.Status.Primary).NotTo(BeNil())
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(ftv1.ReasonNoEligibleNode), c.Message)
			g.Expect(c.Message).To(ContainSubstring("FT VM limit reached"))
		}, time.Minute, 200*time.Millisecond).Should(Succeed())
	})

	It("helm uninstall keeps the CRDs, the FaultTolerantVMs and their running members", func() {
		cluster("stop", "operator") // its RBAC goes with the release
		out := helm("uninstall", "lockstep", "-n", "lockstep-system")
		Expect(out).To(ContainSubstring("uninstalled"))
		for _, crd := range []string{"faulttolerantvms.ft.lockstep.dev", "faulttolerantvmoperations.ft.lockstep.dev"} {
			Expect(k8s.Get(ctx, types.NamespacedName{Name: crd}, &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{
				APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"}})).To(Succeed(), crd)
		}
		Expect(getFTVM("vm-1").Status.State).To(Equal(ftv1.StateProtected))
		Expect(memberVersions("vm-1")).To(HaveLen(2))
		var webhooks = []string{"lockstep-validating", "lockstep-mutating"}
		for _, w := range webhooks {
			err := k8s.Get(ctx, types.NamespacedName{Name: w}, &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{
				APIVersion: "admissionregistration.k8s.io/v1", Kind: kindOf(w)}})
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%s is gone with the release: %v", w, err)
		}
	})
})

func kindOf(webhook string) string {
	if strings.Contains(webhook, "mutating") {
		return "MutatingWebhookConfiguration"
	}
	return "ValidatingWebhookConfiguration"
}

func newFTVM(name string) *ftv1.FaultTolerantVM {
	guest := resource.MustParse("1Gi")
	return &ftv1.FaultTolerantVM{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: ftv1.FaultTolerantVMSpec{
			LoggingNetwork: ftv1.LoggingNetwork{Name: "ft-logging"},
			Template: ftv1.VMITemplate{Spec: virtv1.VirtualMachineInstanceSpec{Domain: virtv1.DomainSpec{
				CPU:    &virtv1.CPU{Cores: 1},
				Memory: &virtv1.Memory{Guest: &guest},
			}}},
		},
	}
}

func getFTVM(name string) *ftv1.FaultTolerantVM {
	f := &ftv1.FaultTolerantVM{}
	ExpectWithOffset(1, k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, f)).To(Succeed())
	return f
}

func waitState(name string, state ftv1.FTState) *ftv1.FaultTolerantVM {
	var f *ftv1.FaultTolerantVM
	EventuallyWithOffset(1, func(g Gomega) {
		f = &ftv1.FaultTolerantVM{}
		g.Expect(k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, f)).To(Succeed())
		g.Expect(f.Status.State).To(Equal(state), "%+v", f.Status.Conditions)
	}, time.Minute, 200*time.Millisecond).Should(Succeed())
	return f
}

// memberVersions maps each member VMI of a FaultTolerantVM to its resourceVersion.
func memberVersions(name string) map[string]string {
	var vmis virtv1.VirtualMachineInstanceList
	ExpectWithOffset(1, k8s.List(context.Background(), &vmis, client.InNamespace(ns), client.MatchingLabels{ftv1.LabelPair: name})).To(Succeed())
	out := map[string]string{}
	for _, v := range vmis.Items {
		out[v.Name] = v.ResourceVersion
	}
	return out
}
