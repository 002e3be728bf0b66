package controllers_test

import (
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/test/apitest"
)

// readObjects reads every object of a multi-document YAML file.
func readObjects(path string) []*unstructured.Unstructured {
	raw, err := os.ReadFile(path)
	Expect(err).NotTo(HaveOccurred(), "run `make installer` first")
	objs, err := apitest.Decode(raw)
	Expect(err).NotTo(HaveOccurred())
	return objs
}

var _ = Describe("Installation", func() {
	var ns string
	AfterEach(func() {
		if ns != "" {
			// As in the admission specs: the sample is deleted only once the operator holds its
			// finalizer, so that the delete never races its first reconcile (which, with the next
			// spec's nodes in place, once created members for it; envtest has no garbage collector).
			waitTaken(ns)
			deleteAllFTVMs(ns)
		}
	})

	It("applies the rendered install (config/default: CRD, RBAC, operator, webhooks, cert-manager, lockstepd, KubeVirt policy) by server-side dry run, and the samples", func() {
		objs := readObjects(filepath.Join("..", "bin", "install.yaml"))
		kinds := map[string]int{}
		for _, u := range objs {
			kinds[u.GetKind()]++
			// Only the namespace is made: the rest is checked by the API server, with the cert-manager,
			// KubeVirt and monitoring CRDs installed, and stored nowhere (the webhook configurations would
			// send this suite's requests to a Service that does not run here).
			opts := []client.ApplyOption{client.FieldOwner("install-test"), client.ForceOwnership}
			if u.GetKind() != "Namespace" {
				opts = append(opts, client.DryRunAll)
			}
			Expect(k8s.Apply(ctx(), client.ApplyConfigurationFromUnstructured(u), opts...)).To(Succeed(), "%s %s", u.GetKind(), u.GetName())
		}
		for _, kind := range []string{"CustomResourceDefinition", "Deployment", "DaemonSet", "PriorityClass", "Service",
			"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "Issuer", "Certificate",
			"MutatingAdmissionPolicy", "ValidatingAdmissionPolicy"} {
			Expect(kinds).To(HaveKey(kind))
		}

		ns = newNamespace()
		for _, f := range []string{"ft-logging-network.yaml", "ft_v1alpha1_faulttolerantvm.yaml"} {
			for _, u := range readObjects(filepath.Join("..", "config", "samples", f)) {
				u.SetNamespace(ns)
				if u.GetKind() == "NetworkAttachmentDefinition" {
					continue // newNamespace made ft-logging already; the sample must decode
				}
				Expect(k8s.Apply(ctx(), client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("install-test"))).To(Succeed(), f)
			}
		}
		sample := getFTVM(ns, "mail-01")
		Expect(sample.Spec.RunStrategy).To(Equal(ftv1.RunStrategyRunning))
		Expect(sample.Spec.ExpectedLoad.MemoryDirtyMBps).To(Equal(int32(5)))
	})
})
