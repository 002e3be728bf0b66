package kubevirt_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/lockstep-dev/lockstep/internal/scheme"
	"github.com/lockstep-dev/lockstep/test/apitest"
	"github.com/lockstep-dev/lockstep/test/kubevirtcontrol"
	"github.com/lockstep-dev/lockstep/test/pki"
)

// kubevirtNamespace is where the install strategy puts KubeVirt.
const kubevirtNamespace = kubevirtcontrol.Namespace

var (
	root string
	k8s  client.Client
	// asKubeVirt writes as virt-controller's ServiceAccount: virt-api's VMI mutator lets only
	// KubeVirt's ServiceAccounts change a VMI's status (virt-handler's reports, in a test).
	asKubeVirt    client.Client
	controllerLog string
	virtAPILog    string
)

// TestMain starts the API server with KubeVirt's CRDs and RBAC from its install strategy, the
// KubeVirt CR as a user sets it for emulation, and virt-api and virt-controller as their
// ServiceAccounts, as the strategy's Deployments run them (test/kubevirtcontrol).
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrllog.SetLogger(logr.Discard())
	var err error
	if root, err = filepath.Abs(filepath.Join("..", "..")); err != nil {
		return fail(err)
	}
	kubevirtBin := filepath.Join(root, "bin", "kubevirt")
	strategy, err := kubevirtcontrol.ReadStrategy(kubevirtBin)
	if err != nil {
		return fail(err)
	}
	crds, err := strategy.CRDs()
	if err != nil {
		return fail(err)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: filepath.Join(root, "bin", "k8s"), CRDInstallOptions: envtest.CRDInstallOptions{CRDs: crds}}
	dir, err := os.MkdirTemp("", "kubevirt-control")
	if err != nil {
		return fail(err)
	}
	defer func() {
		if os.Getenv("KUBEVIRT_KEEP_LOGS") == "" {
			_ = os.RemoveAll(dir)
		}
	}()
	// One CA stands for the cluster's front proxy CA and virt-operator's.
	ca, err := pki.NewCA("kubevirt-test")
	if err != nil {
		return fail(err)
	}
	if err := frontProxy(env, dir, ca); err != nil {
		return fail(err)
	}
	cfg, err := env.Start()
	if err != nil {
		return fail(err)
	}
	defer func() { _ = env.Stop() }()
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme.New()}); err != nil {
		return fail(err)
	}
	impersonating := rest.CopyConfig(cfg)
	impersonating.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + kubevirtNamespace + ":kubevirt-controller"}
	if asKubeVirt, err = client.New(impersonating, client.Options{Scheme: scheme.New()}); err != nil {
		return fail(err)
	}
	ctx := context.Background()
	for _, n := range []string{kubevirtNamespace, ns} {
		if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			return fail(err)
		}
		// No kube-controller-manager: the ServiceAccount a pod runs as by default.
		if err := k8s.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: "default"}}); err != nil {
			return fail(err)
		}
	}
	// KubeVirt's identities and RBAC, as virt-operator installs them.
	if err := strategy.Apply(ctx, k8s, kubevirtcontrol.RBAC...); err != nil {
		return fail(err)
	}
	if err := startKubeVirt(ctx); err != nil {
		return fail(err)
	}
	apiKubeconfig, err := serviceAccountKubeconfig(env, dir, "kubevirt-apiserver")
	if err != nil {
		return fail(err)
	}
	api, err := kubevirtcontrol.StartVirtAPI(ctx, k8s, strategy, kubevirtBin, apiKubeconfig, filepath.Join(dir, "virt-api"), ca)
	if err != nil {
		return fail(err)
	}
	defer api.Stop()
	virtAPILog = api.Log
	controllerKubeconfig, err := serviceAccountKubeconfig(env, dir, "kubevirt-controller")
	if err != nil {
		return fail(err)
	}
	controller, err := kubevirtcontrol.Start(strategy, kubevirtBin, "virt-controller", controllerKubeconfig, filepath.Join(dir, "virt-controller"), nil)
	if err != nil {
		return fail(err)
	}
	defer controller.Stop()
	controllerLog = controller.Log
	return m.Run()
}

// startKubeVirt creates the KubeVirt CR, as a user sets it on a cluster without KVM, and writes
// its status as virt-operator does once KubeVirt runs (kubevirtcontrol.MarkDeployed).
func startKubeVirt(ctx context.Context) error {
	kv := &virtv1.KubeVirt{ObjectMeta: metav1.ObjectMeta{Namespace: kubevirtNamespace, Name: "kubevirt"},
		Spec: virtv1.KubeVirtSpec{Configuration: virtv1.KubeVirtConfiguration{DeveloperConfiguration: &virtv1.DeveloperConfiguration{
			UseEmulation: true, FeatureGates: []string{"Sidecar", "Plugins"}}}}}
	if err := k8s.Create(ctx, kv); err != nil {
		return err
	}
	return kubevirtcontrol.MarkDeployed(ctx, k8s, kv.Name)
}

// serviceAccountKubeconfig writes, in dir, a kubeconfig of envtest's API server as KubeVirt's
// ServiceAccount sa, and returns its path.
func serviceAccountKubeconfig(env *envtest.Environment, dir, sa string) (string, error) {
	user, err := env.AddUser(envtest.User{Name: "system:serviceaccount:" + kubevirtNamespace + ":" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + kubevirtNamespace, "system:authenticated"}}, nil)
	if err != nil {
		return "", err
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, sa+".kubeconfig")
	return path, os.WriteFile(path, kubeconfig, 0o600)
}

func readObjects(paths ...string) ([]*unstructured.Unstructured, error) {
	var all []*unstructured.Unstructured
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		objs, err := apitest.Decode(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		all = append(all, objs...)
	}
	return all, nil
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "test/kubevirt:", err)
	return 1
}
