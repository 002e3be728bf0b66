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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockstep-dev/lockstep/internal/lockstepd"
	"github.com/lockstep-dev/lockstep/internal/nodecert"
	"github.com/lockstep-dev/lockstep/test/apitest"
)

// TestEachLockstepdGetsACertificateForItsOwnNodeOnly runs the operator's signer under the
// operator's generated RBAC (apitest.StartSigner) and lockstepd's certificate
// requester with a ServiceAccount token bound to its pod, against the real API server: lockstepd
// gets a certificate that names its node, signed by the CA the operator published, with the
// lifetime it asked for; a request for another node's certificate, or with a token bound to no
// pod, is denied with a message that says why.
func TestEachLockstepdGetsACertificateForItsOwnNodeOnly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	apitest.InstallIdentities(t, k8s, root)
	caPEM := apitest.StartSigner(t, restCfg, k8s)

	// lockstepd of node cert-node-a, with the token the kubelet would mount in its pod.
	own := "cert-node-a"
	if err := k8s.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: own}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: own}}) })
	boundToken, unboundToken := apitest.LockstepdPod(t, restCfg, k8s, own)
	lsd, unbound := apitest.As(t, restCfg, boundToken), apitest.As(t, restCfg, unboundToken)

	// The kubelet's part: the CA's ConfigMap as the mounted file.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), caPEM, 0o644); err != nil {
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
	pool.AppendCertsFromPEM(caPEM)
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
