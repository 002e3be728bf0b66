//go:build linux

package dataplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/lockstep-dev/lockstep/controllers"
	"github.com/lockstep-dev/lockstep/internal/lockstepd"
	"github.com/lockstep-dev/lockstep/internal/nodecert"
	"github.com/lockstep-dev/lockstep/internal/scheme"
)

// TestEachLockstepdGetsACertificateForItsOwnNodeOnly runs the operator's signer under the
// operator's generated RBAC (impersonating its ServiceAccount) and lockstepd's certificate
// requester with a ServiceAccount token bound to its pod, against the real API server: lockstepd
// gets a certificate that names its node, signed by the CA the operator published, with the
// lifetime it asked for; a request for another node's certificate, or with a token bound to no
// pod, is denied with a message that says why.
func TestEachLockstepdGetsACertificateForItsOwnNodeOnly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "lockstep-system"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	root := filepath.Join("..", "..", "config")
	for _, f := range []string{"lockstepd/rbac/service_account.yaml", "lockstepd/rbac/role.yaml", "lockstepd/rbac/role_binding.yaml",
		"rbac/service_account.yaml", "rbac/role.yaml", "rbac/role_binding.yaml"} {
		applyFile(t, filepath.Join(root, f))
	}

	// The operator's signer, as the operator's ServiceAccount.
	opCfg := rest.CopyConfig(restCfg)
	opCfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:lockstep-system:lockstep-operator"}
	mgr, err := ctrl.NewManager(opCfg, ctrl.Options{Scheme: scheme.New(), Cache: controllers.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	ca := types.NamespacedName{Namespace: "lockstep-system", Name: "lockstepd-ca"}
	signer := &controllers.LockstepdSigner{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Config: controllers.SignerConfig{
		CA: ca, ServiceAccount: "system:serviceaccount:lockstep-system:lockstepd", MaxLifetime: 24 * time.Hour, CALifetime: 48 * time.Hour}}
	if err := signer.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("the signer stopped: %v", err)
		}
	}()

	// lockstepd of node cert-node-a, with the token the kubelet would mount in its pod.
	own := "cert-node-a"
	if err := k8s.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: own}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: own}}) })
	lsd, unbound := lockstepdOf(t, "lockstepd-cert-a", own)

	// The kubelet's part: the CA's ConfigMap, once the operator published it, as the mounted file.
	dir := t.TempDir()
	published := &corev1.ConfigMap{}
	eventually(t, "the operator publishes the lockstepd CA", 30*time.Second, func() bool {
		return k8s.Get(ctx, ca, published) == nil && published.Data["ca.crt"] != ""
	})
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), []byte(published.Data["ca.crt"]), 0o644); err != nil {
		t.Fatal(err)
	}

	cfg := &lockstepd.Config{NodeName: own, CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"),
		CAFile: filepath.Join(dir, "ca.crt"), CertLifetime: time.Hour}
	requester := &lockstepd.CertRequester{Config: cfg, Client: lsd, Log: logr.Discard(), Retry: time.Second}
	ectx, ecancel := context.WithTimeout(ctx, time.Minute)
	defer ecancel()
	if err := requester.Ensure(ectx); err != nil {
		t.Fatalf("lockstepd got no certificate: %v", err)
	}
	pair, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	leaf := pair.Leaf
	if node, err := nodecert.NodeOf(leaf); err != nil || node != own {
		t.Fatalf("the certificate names %q (%v), want %s", node, err, own)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(published.Data["ca.crt"]))
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Fatalf("the certificate does not verify against the published CA: %v", err)
	}
	if life := time.Until(leaf.NotAfter); life > time.Hour || life < 50*time.Minute {
		t.Fatalf("the certificate lives %s more, lockstepd asked for 1h", life)
	}

	// Requests the signer must deny.
	deniedWith := func(what string, c client.Client, node, want string) {
		t.Helper()
		csrPEM, _, err := nodecert.NewRequest(node)
		if err != nil {
			t.Fatal(err)
		}
		csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{GenerateName: "lockstepd-test-"},
			Spec: certificatesv1.CertificateSigningRequestSpec{Request: csrPEM, SignerName: nodecert.SignerName,
				Usages: []certificatesv1.KeyUsage{certificatesv1.UsageClientAuth, certificatesv1.UsageServerAuth}}}
		if err := c.Create(ctx, csr); err != nil {
			t.Fatalf("%s: creating the request: %v", what, err)
		}
		var got certificatesv1.CertificateSigningRequestCondition
		eventually(t, what+": the signer decides", 30*time.Second, func() bool {
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(csr), csr); err != nil || len(csr.Status.Conditions) == 0 {
				return false
			}
			got = csr.Status.Conditions[0]
			return true
		})
		if got.Type != certificatesv1.CertificateDenied || !strings.Contains(got.Message, want) || len(csr.Status.Certificate) > 0 {
			t.Errorf("%s: %s %q (certificate: %d bytes), want Denied with %q", what, got.Type, got.Message, len(csr.Status.Certificate), want)
		}
	}
	deniedWith("another node's certificate", lsd, "cert-node-b", `may ask only for the common name "system:lockstepd:cert-node-a"`)
	deniedWith("a token bound to no pod", unbound, own, "not bound to a pod on a node")
}
