package kubevirt_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/lockstep-dev/lockstep/test/pki"
)

// virt-api runs as a process beside the API server (test/kubevirtcontrol, which says how that
// differs from a cluster).

// frontProxy gives the API server the request-header flags a kubeadm cluster has: virt-api does
// not start without the request-header CA that the API server then publishes in
// kube-system/extension-apiserver-authentication.
func frontProxy(env *envtest.Environment, dir string, ca *pki.CA) error {
	caFile := filepath.Join(dir, "front-proxy-ca.crt")
	if err := os.WriteFile(caFile, ca.PEM(), 0o600); err != nil {
		return err
	}
	cert, key := filepath.Join(dir, "front-proxy-client.crt"), filepath.Join(dir, "front-proxy-client.key")
	if err := ca.WriteKeyPair(cert, key, "front-proxy-client"); err != nil {
		return err
	}
	args := env.ControlPlane.GetAPIServer().Configure()
	args.Set("requestheader-client-ca-file", caFile)
	args.Set("requestheader-allowed-names", "front-proxy-client")
	args.Set("requestheader-username-headers", "X-Remote-User")
	args.Set("requestheader-group-headers", "X-Remote-Group")
	args.Set("requestheader-extra-headers-prefix", "X-Remote-Extra-")
	args.Set("proxy-client-cert-file", cert)
	args.Set("proxy-client-key-file", key)
	return nil
}

// isWebhookDenial says whether err is a refusal by the webhook named name.
func isWebhookDenial(err error, name string) bool {
	return err != nil && strings.Contains(err.Error(), fmt.Sprintf("admission webhook %q denied", name))
}
