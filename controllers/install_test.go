package controllers_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// readObjects reads every object of a multi-document YAML file.
func readObjects(path string) []*unstructured.Unstructured {
	raw, err := os.ReadFile(path)
	Expect(err).NotTo(HaveOccurred(), "run `make installer` first")
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			Expect(err).NotTo(HaveOccurred())
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

var _ = Describe("Installation", func() {
	var ns string
	AfterEach(func() {
		if ns != "" {
			deleteAllFTVMs(ns)
		}
	})

	It("applies the rendered install manifest (CRD, RBAC, operator) and the samples to a real API server", func() {
		objs := readObjects(filepath.Join("..", "bin", "install.yaml"))
		kinds := map[string]int{}
		for _, u := range objs {
			kinds[u.GetKind()]++
			Expect(k8s.Apply(ctx(), client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("install-test"), client.ForceOwnership)).
				To(Succeed(), "%s %s", u.GetKind(), u.GetName())
		}
		Expect(kinds).To(HaveKey("CustomResourceDefinition"))
		Expect(kinds).To(HaveKey("Deployment"))
		Expect(kinds).To(HaveKey("PriorityClass"))

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
		Expect(sample.Spec.ExpectedLoad.DiskReadMBps).To(Equal(int32(10)))
	})
})
