package kubevirt_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/lockstep-dev/lockstep/internal/scheme"
	"github.com/lockstep-dev/lockstep/test/apitest"
	"github.com/lockstep-dev/lockstep/test/pki"
)

// kubevirtNamespace is where the install strategy puts KubeVirt (hack/kubevirtstrategy's default).
const kubevirtNamespace = "kubevirt"

var (
	root          string
	k8s           client.Client
	controllerLog string
	virtAPILog    string
)

// TestMain starts the API server with KubeVirt's CRDs and RBAC from its install strategy, the
// KubeVirt CR as a user sets it for emulation, and virt-api and virt-controller as their
// ServiceAccounts, as the strategy's Deployments run them.
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
	strategy, err := readObjects(filepath.Join(kubevirtBin, "install-strategy.yaml"), filepath.Join(kubevirtBin, "kubevirt-crd.yaml"))
	if err != nil {
		return fail(fmt.Errorf("%w (make kubevirt-assets builds them)", err))
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, u := range strategy {
		if u.GetKind() == "CustomResourceDefinition" {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, crd); err != nil {
				return fail(err)
			}
			crds = append(crds, crd)
		}
	}
	env := &envtest.Environment{BinaryAssetsDirectory: filepath.Join(root, "bin", "k8s"), CRDInstallOptions: envtest.CRDInstallOptions{CRDs: crds}}
	certs, err := os.MkdirTemp("", "kubevirt-certs")
	if err != nil {
		return fail(err)
	}
	defer func() { _ = os.RemoveAll(certs) }()
	// One CA stands for the cluster's front proxy CA and virt-operator's.
	ca, err := pki.NewCA("kubevirt-test")
	if err != nil {
		return fail(err)
	}
	if err := frontProxy(env, certs, ca); err != nil {
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
	// virt-controller's identity and RBAC, as virt-operator installs them.
	for _, u := range strategy {
		if !slices.Contains([]string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}, u.GetKind()) {
			continue
		}
		if err := k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("virt-operator"), client.ForceOwnership); err != nil {
			return fail(fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err))
		}
	}
	if err := startKubeVirt(ctx); err != nil {
		return fail(err)
	}
	apiUser, err := env.AddUser(envtest.User{Name: "system:serviceaccount:kubevirt:kubevirt-apiserver",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kubevirt", "system:authenticated"}}, nil)
	if err != nil {
		return fail(err)
	}
	stopAPI, err := startVirtAPI(ctx, apiUser, strategy, kubevirtBin, ca)
	if err != nil {
		return fail(err)
	}
	defer stopAPI()
	controller, err := env.AddUser(envtest.User{Name: "system:serviceaccount:kubevirt:kubevirt-controller",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kubevirt", "system:authenticated"}}, nil)
	if err != nil {
		return fail(err)
	}
	stop, err := startVirtController(controller, strategy, kubevirtBin)
	if err != nil {
		return fail(err)
	}
	defer stop()
	return m.Run()
}

// startKubeVirt creates the KubeVirt CR, as a user sets it on a cluster without KVM, and writes
// its status as virt-operator does once KubeVirt runs: deployed (virt-controller takes
// useEmulation only then), with the default architecture, its own (virt-api's VMI mutator gives
// it to VMIs that name none, and its validator refuses a VMI without one).
func startKubeVirt(ctx context.Context) error {
	kv := &virtv1.KubeVirt{ObjectMeta: metav1.ObjectMeta{Namespace: kubevirtNamespace, Name: "kubevirt"},
		Spec: virtv1.KubeVirtSpec{Configuration: virtv1.KubeVirtConfiguration{DeveloperConfiguration: &virtv1.DeveloperConfiguration{
			UseEmulation: true, FeatureGates: []string{"Sidecar", "Plugins"}}}}}
	if err := k8s.Create(ctx, kv); err != nil {
		return err
	}
	kv.Status.Phase, kv.Status.DefaultArchitecture = virtv1.KubeVirtPhaseDeployed, goruntime.GOARCH
	return k8s.Status().Update(ctx, kv)
}

// startVirtController runs virt-controller as user (startComponent). Its output goes to
// controllerLog.
func startVirtController(user *envtest.AuthenticatedUser, strategy []*unstructured.Unstructured, bin string) (func(), error) {
	c, err := startComponent(user, strategy, bin, "virt-controller", nil)
	if err != nil {
		return nil, err
	}
	controllerLog = c.log
	return c.stop, nil
}

// component is a KubeVirt component running as a process.
type component struct {
	// dir holds its kubeconfig, its log and what the caller put there; removed by stop unless
	// KUBEVIRT_KEEP_LOGS is set.
	dir, log string
	port     int
	stop     func()
}

// startComponent runs the KubeVirt component name as user, with the arguments and environment of
// the install strategy's Deployment, its port moved to a free one on loopback, and the arguments
// that extra returns for its directory (certificates it wrote there, say).
func startComponent(user *envtest.AuthenticatedUser, strategy []*unstructured.Unstructured, bin, name string, extra func(dir string) ([]string, error)) (*component, error) {
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", name)
	if err != nil {
		return nil, err
	}
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, kubeconfig, 0o600); err != nil {
		return nil, err
	}
	args, env, err := deploymentCommand(strategy, name)
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	setArg(args, "--port", strconv.Itoa(port))
	args = append(args, "--listen", "127.0.0.1", "--kubeconfig", kc)
	if extra != nil {
		more, err := extra(dir)
		if err != nil {
			return nil, err
		}
		args = append(args, more...)
	}
	c := &component{dir: dir, log: filepath.Join(dir, name+".log"), port: port}
	out, err := os.Create(c.log)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(bin, name), args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = append(os.Environ(), env...), out, out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c.stop = func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = out.Close()
		if os.Getenv("KUBEVIRT_KEEP_LOGS") == "" {
			_ = os.RemoveAll(dir)
		}
	}
	return c, nil
}

// deploymentCommand is the arguments and environment of the first container of the strategy's
// Deployment name.
func deploymentCommand(strategy []*unstructured.Unstructured, name string) (args, env []string, err error) {
	for _, u := range strategy {
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

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "test/kubevirt:", err)
	return 1
}
