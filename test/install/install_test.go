// Package install tests the install paths against a real API server: the Helm chart
// (charts/lockstep) rendered with its default and with non-default values, and the kustomize
// install (config/default, config/prometheus), each applied by server-side dry run with the
// KubeVirt, Multus, cert-manager and Prometheus operator CRDs installed; and that the chart and
// config/default install the same objects with the same RBAC rules, webhooks and admission
// policies (a test that fails when they drift).
package install

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockstep-dev/lockstep/test/apitest"
)

var (
	root = filepath.Join("..", "..")
	k8s  client.Client
)

func TestMain(m *testing.M) {
	env, _, c, err := apitest.StartWithCRDs(root, "kubevirt", "multus", "cert-manager", "monitoring")
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the API server (make envtest-assets test-crds):", err)
		os.Exit(1)
	}
	k8s = c
	code := m.Run()
	_ = env.Stop()
	os.Exit(code)
}

// tool is a pinned tool under bin/ (make installs it).
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join(root, "bin", name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s: run `make test-install`, which installs it", p)
	}
	return p
}

func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(tool(t, name), args...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return out
}

func decode(t *testing.T, raw []byte) []*unstructured.Unstructured {
	t.Helper()
	objs, err := apitest.Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// helmTemplate renders the chart into namespace ns with --set values.
func helmTemplate(t *testing.T, ns string, set ...string) []*unstructured.Unstructured {
	args := []string{"template", "lockstep", "charts/lockstep", "--namespace", ns, "--include-crds", "--kube-version", "1.37.1"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return decode(t, run(t, "helm", args...))
}

// dryRun applies every object by server-side dry run; the namespace ns is made for real.
func dryRun(t *testing.T, ns string, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, u := range objs {
		if u.GetKind() == "Namespace" {
			continue
		}
		if err := k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("install-test"), client.ForceOwnership, client.DryRunAll); err != nil {
			t.Errorf("%s %s/%s: %v", u.GetKind(), u.GetNamespace(), u.GetName(), err)
		}
	}
}

func TestHelmLint(t *testing.T) {
	run(t, "helm", "lint", "charts/lockstep", "--strict", "--kube-version", "1.37.1")
	run(t, "helm", "lint", "charts/lockstep", "--strict", "--kube-version", "1.37.1", "--values", "test/install/testdata/values-nondefault.yaml")
}

func TestChartAppliesWithDefaultValues(t *testing.T) {
	objs := helmTemplate(t, "lockstep-system")
	dryRun(t, "lockstep-system", objs)
}

func TestChartAppliesWithNonDefaultValues(t *testing.T) {
	objs := decode(t, run(t, "helm", "template", "ft", "charts/lockstep", "--namespace", "ft-system", "--include-crds",
		"--kube-version", "1.37.1", "--values", "test/install/testdata/values-nondefault.yaml"))
	dryRun(t, "ft-system", objs)
	kinds := map[string]bool{}
	for _, u := range objs {
		kinds[u.GetKind()] = true
		if ns := u.GetNamespace(); ns != "" && ns != "ft-system" {
			t.Errorf("%s %s is in namespace %s, not the release's", u.GetKind(), u.GetName(), ns)
		}
		if strings.Contains(string(must(u.MarshalJSON())), "lockstep-system") {
			t.Errorf("%s %s still names lockstep-system", u.GetKind(), u.GetName())
		}
	}
	for _, k := range []string{"Secret", "Plugin", "ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap", "NetworkAttachmentDefinition"} {
		if !kinds[k] {
			t.Errorf("no %s with non-default values", k)
		}
	}
	for _, k := range []string{"Certificate", "Issuer"} {
		if kinds[k] {
			t.Errorf("a %s without cert-manager", k)
		}
	}
	// The members' QEMU is the image the values name, pulled as they say.
	found := false
	for _, u := range objs {
		if u.GetKind() == "MutatingAdmissionPolicy" && u.GetName() == "lockstep-member-qemu" {
			found = true
			policy := string(must(u.MarshalJSON()))
			for _, want := range []string{`registry.example.com/ft/lockstep-qemu@sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210`, `pullPolicy: \"Always\"`} {
				if !strings.Contains(policy, want) {
					t.Errorf("the member-qemu policy lacks %s: %s", want, policy)
				}
			}
		}
	}
	if !found {
		t.Error("no member-qemu policy")
	}
}

func TestKustomizeInstallApplies(t *testing.T) {
	dryRun(t, "lockstep-system", decode(t, run(t, "kustomize", "build", "config/default")))
	dryRun(t, "lockstep-system", decode(t, run(t, "kustomize", "build", "config/prometheus")))
}

// TestChartAndKustomizeInstallTheSame compares the chart (default values and monitoring on) with
// config/default and config/prometheus: the same objects, and the same RBAC rules, webhooks and
// admission policies.
func TestChartAndKustomizeInstallTheSame(t *testing.T) {
	chart := index(helmTemplate(t, "lockstep-system", "monitoring.serviceMonitor.enabled=true",
		"monitoring.prometheusRule.enabled=true", "monitoring.dashboard.enabled=true"))
	kust := index(append(decode(t, run(t, "kustomize", "build", "config/default")),
		decode(t, run(t, "kustomize", "build", "config/prometheus"))...))
	delete(kust, "Namespace//lockstep-system") // Helm installs into a namespace it is given
	if a, b := keys(chart), keys(kust); !equality.Semantic.DeepEqual(a, b) {
		t.Fatalf("the chart and config/default install different objects:\nchart only: %v\nkustomize only: %v", minus(a, b), minus(b, a))
	}
	compared := 0
	for key, c := range chart {
		k := kust[key]
		for _, field := range []string{"rules", "roleRef", "subjects", "webhooks", "spec"} {
			if field == "spec" && !specCompared[c.GetKind()] {
				continue
			}
			cv, _, _ := unstructured.NestedFieldNoCopy(c.Object, field)
			kv, _, _ := unstructured.NestedFieldNoCopy(k.Object, field)
			if !equality.Semantic.DeepEqual(cv, kv) {
				t.Errorf("%s: %s differs between the chart and config/default:\nchart:     %v\nkustomize: %v", key, field, cv, kv)
			}
			compared++
		}
	}
	if compared < 20 {
		t.Fatalf("only %d fields compared", compared)
	}
}

// specCompared are the kinds whose whole spec must be the same in both installs (the Deployment
// and the DaemonSet take their settings from values, and are compared by the objects they are).
var specCompared = map[string]bool{
	"CustomResourceDefinition": true, "ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true,
	"MutatingAdmissionPolicy": true, "MutatingAdmissionPolicyBinding": true, "PrometheusRule": true,
	"ServiceMonitor": true, "PodMonitor": true, "Certificate": true, "Issuer": true, "Service": true,
}

func index(objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	out := map[string]*unstructured.Unstructured{}
	for _, u := range objs {
		out[u.GetKind()+"/"+u.GetNamespace()+"/"+u.GetName()] = u
	}
	return out
}

func keys(m map[string]*unstructured.Unstructured) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func minus(a, b []string) []string {
	in := map[string]bool{}
	for _, x := range b {
		in[x] = true
	}
	var out []string
	for _, x := range a {
		if !in[x] {
			out = append(out, x)
		}
	}
	return out
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// TestGitOpsExamples checks that the Argo CD and Flux examples (docs/examples) decode and point at
// the chart in this repository, with values the chart's schema takes.
func TestGitOpsExamples(t *testing.T) {
	for file, path := range map[string][]string{
		"argocd-application.yaml": {"spec", "source", "path"},
		"flux-helmrelease.yaml":   {"spec", "chart", "spec", "chart"},
	} {
		raw, err := os.ReadFile(filepath.Join(root, "docs", "examples", file))
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, u := range decode(t, raw) {
			chart, ok, _ := unstructured.NestedString(u.Object, path...)
			if !ok {
				continue
			}
			found = true
			if _, err := os.Stat(filepath.Join(root, filepath.Clean(chart), "Chart.yaml")); err != nil {
				t.Errorf("%s: %s is not a chart: %v", file, chart, err)
			}
			values, _, _ := unstructured.NestedMap(u.Object, "spec", "source", "helm", "valuesObject")
			if values == nil {
				values, _, _ = unstructured.NestedMap(u.Object, "spec", "values")
			}
			vf := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(vf, must(json.Marshal(values)), 0o600); err != nil {
				t.Fatal(err)
			}
			run(t, "helm", "template", "lockstep", "charts/lockstep", "--kube-version", "1.37.1", "--values", vf)
		}
		if !found {
			t.Errorf("%s names no chart at %v", file, path)
		}
	}
}
