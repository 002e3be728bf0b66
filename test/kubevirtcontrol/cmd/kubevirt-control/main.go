// Command kubevirt-control runs KubeVirt v1.9.0's own virt-api on a cluster whose nodes cannot run
// KubeVirt's pods (the local cluster, hack/local-cluster.sh), doing first what virt-operator does
// for it: KubeVirt's CRDs and RBAC from the install strategy, virt-api's certificates, its webhook
// configurations, and, once the user's KubeVirt CR exists, its status as deployed. virt-api runs
// as its ServiceAccount (a token from the TokenRequest API). See test/kubevirtcontrol for how this
// differs from a cluster that virt-operator deploys.
//
//	kubevirt-control --kubeconfig admin.yaml --bin bin/kubevirt --dir STATE
//
// It runs until SIGTERM or SIGINT, or until virt-api ends (then it exits 1).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockstep-dev/lockstep/internal/scheme"
	"github.com/lockstep-dev/lockstep/test/kubevirtcontrol"
	"github.com/lockstep-dev/lockstep/test/pki"
)

func main() {
	// controller-runtime's client/config registers --kubeconfig where it is linked in.
	if flag.Lookup("kubeconfig") == nil {
		flag.String("kubeconfig", "", "The cluster's admin kubeconfig (what virt-operator's rights stand for).")
	}
	bin := flag.String("bin", "bin/kubevirt", "make kubevirt-assets' directory: KubeVirt's binaries and install strategy.")
	dir := flag.String("dir", "", "Where virt-api's kubeconfig, certificates and log go.")
	kubevirt := flag.String("kubevirt", "kubevirt", "The name of the user's KubeVirt CR, in namespace "+kubevirtcontrol.Namespace+".")
	flag.Parse()
	kubeconfig := flag.Lookup("kubeconfig").Value.String()
	if kubeconfig == "" || *dir == "" {
		fmt.Fprintln(os.Stderr, "kubevirt-control: --kubeconfig and --dir are required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, kubeconfig, *bin, *dir, *kubevirt); err != nil {
		fmt.Fprintln(os.Stderr, "kubevirt-control:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig, bin, dir, kubevirt string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	sch := scheme.New()
	if err := apiextensionsv1.AddToScheme(sch); err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: sch})
	if err != nil {
		return err
	}
	strategy, err := kubevirtcontrol.ReadStrategy(bin)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// What virt-operator creates first: the namespace, the CRDs, the identities and their rights.
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kubevirtcontrol.Namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	if err := strategy.Apply(ctx, c, "CustomResourceDefinition"); err != nil {
		return err
	}
	if err := established(ctx, c, strategy); err != nil {
		return err
	}
	if err := strategy.Apply(ctx, c, kubevirtcontrol.RBAC...); err != nil {
		return err
	}
	log("KubeVirt's CRDs and RBAC applied; waiting for the KubeVirt CR %s/%s", kubevirtcontrol.Namespace, kubevirt)
	if err := poll(ctx, 10*time.Minute, func() (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Namespace: kubevirtcontrol.Namespace, Name: kubevirt}, &virtv1.KubeVirt{})
		return err == nil, client.IgnoreNotFound(err)
	}); err != nil {
		return fmt.Errorf("the KubeVirt CR: %w", err)
	}
	if err := kubevirtcontrol.MarkDeployed(ctx, c, kubevirt); err != nil {
		return err
	}
	apiKubeconfig, err := serviceAccountKubeconfig(ctx, c, cfg, "kubevirt-apiserver", filepath.Join(dir, "virt-api.kubeconfig"))
	if err != nil {
		return err
	}
	ca, err := pki.NewCA("kubevirt-control")
	if err != nil {
		return err
	}
	api, err := kubevirtcontrol.StartVirtAPI(ctx, c, strategy, bin, apiKubeconfig, filepath.Join(dir, "virt-api"), ca)
	if err != nil {
		return err
	}
	log("virt-api serves on 127.0.0.1:%d, its webhooks installed; its log: %s", api.Port, api.Log)
	select {
	case <-ctx.Done():
		api.Stop()
		return nil
	case <-api.Exited:
		return fmt.Errorf("virt-api ended (%v):\n%s", api.Err, kubevirtcontrol.Tail(api.Log, 30))
	}
}

// established waits until the strategy's CRDs are served.
func established(ctx context.Context, c client.Client, s kubevirtcontrol.Strategy) error {
	crds, err := s.CRDs()
	if err != nil {
		return err
	}
	for _, want := range crds {
		err := poll(ctx, time.Minute, func() (bool, error) {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := c.Get(ctx, client.ObjectKey{Name: want.Name}, crd); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			for _, cond := range crd.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s: %w", want.Name, err)
		}
	}
	return nil
}

// serviceAccountKubeconfig writes to path a kubeconfig of the cluster as KubeVirt's
// ServiceAccount sa, with a token the TokenRequest API issues for a day (what the kubelet mounts
// into a pod of the ServiceAccount), and returns path.
func serviceAccountKubeconfig(ctx context.Context, c client.Client, cfg *rest.Config, sa, path string) (string, error) {
	account := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: kubevirtcontrol.Namespace, Name: sa}}
	day := int64(24 * 60 * 60)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &day}}
	if err := c.SubResource("token").Create(ctx, account, req); err != nil {
		return "", fmt.Errorf("a token of %s: %w", sa, err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["cluster"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile}
	kc.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: req.Status.Token}
	kc.Contexts[sa] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: sa}
	kc.CurrentContext = sa
	return path, clientcmd.WriteToFile(*kc, path)
}

// poll calls done every half second, at once first, until it says so, fails, or limit passes.
func poll(ctx context.Context, limit time.Duration, done func() (bool, error)) error {
	return wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, limit, true, func(context.Context) (bool, error) { return done() })
}

func log(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s kubevirt-control: %s\n", time.Now().UTC().Format(time.RFC3339), fmt.Sprintf(format, args...))
}
