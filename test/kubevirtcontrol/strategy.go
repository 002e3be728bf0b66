// Package kubevirtcontrol runs KubeVirt v1.9.0's own control plane, virt-api and virt-controller
// (built from source by hack/build-kubevirt.sh), as processes against an API server, and does for
// them what virt-operator does in a cluster: it applies the install strategy's CRDs, RBAC and
// webhook configurations (hack/kubevirtstrategy generates the strategy from virt-operator), issues
// virt-api's certificates, and marks the KubeVirt CR deployed. make test-kubevirt runs them on
// envtest's API server; the local cluster (hack/local-cluster.sh, cmd/kubevirt-control) on its own.
//
// What differs from a cluster where virt-operator deploys KubeVirt, each because no Service reaches
// a process on loopback: the webhooks name virt-api by URL rather than by Service (the API server
// refuses loopback Endpoints), their caBundle is this package's CA, and the APIServices of
// subresources.kubevirt.io (console, VNC, migrate) are not registered. virt-operator's own
// validator (on KubeVirt CRs) is not installed: virt-operator does not run.
package kubevirtcontrol

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockstep-dev/lockstep/test/apitest"
	"github.com/lockstep-dev/lockstep/test/pki"
)

// Namespace is where the install strategy puts KubeVirt (hack/kubevirtstrategy's default).
const Namespace = "kubevirt"

// fieldOwner is who applies what virt-operator would.
const fieldOwner = client.FieldOwner("virt-operator")

// Strategy is KubeVirt's install strategy: the objects virt-operator creates.
type Strategy []*unstructured.Unstructured

// ReadStrategy reads the strategy and KubeVirt's own CRD that make kubevirt-assets writes to bin
// (bin/kubevirt).
func ReadStrategy(bin string) (Strategy, error) {
	var all Strategy
	for _, f := range []string{"install-strategy.yaml", "kubevirt-crd.yaml"} {
		data, err := os.ReadFile(filepath.Join(bin, f))
		if err != nil {
			return nil, fmt.Errorf("%w (make kubevirt-assets writes it)", err)
		}
		objs, err := apitest.Decode(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		all = append(all, objs...)
	}
	return all, nil
}

// CRDs are the strategy's CustomResourceDefinitions.
func (s Strategy) CRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, u := range s {
		if u.GetKind() != "CustomResourceDefinition" {
			continue
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, crd); err != nil {
			return nil, err
		}
		crds = append(crds, crd)
	}
	return crds, nil
}

// Apply applies the strategy's objects of the given kinds, as virt-operator creates them.
func (s Strategy) Apply(ctx context.Context, c client.Client, kinds ...string) error {
	for _, u := range s {
		if !slices.Contains(kinds, u.GetKind()) {
			continue
		}
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), fieldOwner, client.ForceOwnership); err != nil {
			return fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	return nil
}

// RBAC are the kinds of KubeVirt's identities and their rights.
var RBAC = []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}

// DeploymentCommand is the arguments and environment of the first container of the strategy's
// Deployment name.
func (s Strategy) DeploymentCommand(name string) (args, env []string, err error) {
	for _, u := range s {
		if u.GetKind() != "Deployment" || u.GetName() != name {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
		if len(containers) == 0 {
			break
		}
		c := &corev1.Container{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(containers[0].(map[string]any), c); err != nil {
			return nil, nil, err
		}
		for _, e := range c.Env {
			env = append(env, e.Name+"="+e.Value)
		}
		return c.Args, env, nil
	}
	return nil, nil, fmt.Errorf("the install strategy has no Deployment %s", name)
}

// VirtAPIWebhooks are the strategy's webhook configurations that virt-api serves.
var VirtAPIWebhooks = []string{"virt-api-validator", "virt-api-mutator", "virt-launcher-pod-mutator"}

// InstallWebhooks applies the strategy's configurations of virt-api's webhooks, each webhook
// pointed at url with its path and trusting ca.
func (s Strategy) InstallWebhooks(ctx context.Context, c client.Client, url string, ca *pki.CA) error {
	for _, u := range s {
		if (u.GetKind() != "ValidatingWebhookConfiguration" && u.GetKind() != "MutatingWebhookConfiguration") || !slices.Contains(VirtAPIWebhooks, u.GetName()) {
			continue
		}
		u = u.DeepCopy()
		hooks, _, _ := unstructured.NestedSlice(u.Object, "webhooks")
		for i, h := range hooks {
			hook := h.(map[string]any)
			path, _, _ := unstructured.NestedString(hook, "clientConfig", "service", "path")
			hook["clientConfig"] = map[string]any{"url": url + path, "caBundle": base64.StdEncoding.EncodeToString(ca.PEM())}
			hooks[i] = hook
		}
		if err := unstructured.SetNestedSlice(u.Object, hooks, "webhooks"); err != nil {
			return err
		}
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), fieldOwner, client.ForceOwnership); err != nil {
			return fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	return nil
}
