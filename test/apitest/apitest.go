// Package apitest runs a real kube-apiserver and etcd (envtest, from make envtest-assets) with
// lockstep's CRDs and KubeVirt's (make test-crds), for the tiers that run lockstepd as a process,
// and writes the kubeconfigs those processes read.
package apitest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/lockstep-dev/lockstep/internal/scheme"
)

// Start starts the API server with lockstep's and KubeVirt's CRDs; root is the repository's root.
// Stop it with env.Stop. The test process's controller-runtime log is discarded (the processes
// under test write their own).
func Start(root string) (*envtest.Environment, *rest.Config, client.Client, error) {
	return StartWithCRDs(root, "kubevirt")
}

// StartWithCRDs is Start with the test CRDs of the given groups (bin/test-crds: kubevirt, multus,
// cert-manager, monitoring).
func StartWithCRDs(root string, groups ...string) (*envtest.Environment, *rest.Config, client.Client, error) {
	ctrllog.SetLogger(logr.Discard())
	paths := []string{filepath.Join(root, "config", "crd", "bases")}
	for _, g := range groups {
		paths = append(paths, filepath.Join(root, "bin", "test-crds", g))
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: filepath.Join(root, "bin", "k8s"),
		CRDDirectoryPaths:     paths,
		ErrorIfCRDPathMissing: true,
	}
	if os.Getenv("KUBEBUILDER_ASSETS") != "" {
		env.BinaryAssetsDirectory = ""
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		_ = env.Stop()
		return nil, nil, nil, err
	}
	return env, cfg, c, nil
}

// WriteKubeconfig writes dir/name.kubeconfig: cfg's credentials, or token's when it is set, with
// the API server reached at server (host:port, a forwarder into a network namespace), and
// returns its path.
func WriteKubeconfig(tb testing.TB, cfg *rest.Config, dir, name, server string) string {
	return WriteKubeconfigAs(tb, cfg, dir, name, server, "")
}

// WriteKubeconfigAs is WriteKubeconfig with a bearer token for credentials ("" : cfg's).
func WriteKubeconfigAs(tb testing.TB, cfg *rest.Config, dir, name, server, token string) string {
	tb.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: "https://" + server, CertificateAuthorityData: cfg.CAData, TLSServerName: "localhost"}
	kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	if token != "" {
		kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: token}
	}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "user"}
	kc.CurrentContext = "envtest"
	p := filepath.Join(dir, name+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, p); err != nil {
		tb.Fatal(err)
	}
	return p
}
