package lockstepd

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockstep-dev/lockstep/internal/nodecert"
)

// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=create;get

// CertRequester obtains the node's certificate from the operator's signer and renews it: it asks
// with a CertificateSigningRequest, which the API server attributes to lockstepd's pod-bound
// ServiceAccount token, and the signer approves only for the node that token is bound to.
type CertRequester struct {
	Config *Config
	// Client reaches the API past any cache.
	Client client.Client
	Log    logr.Logger
	// Retry is how long to wait after a failed request (default 30 s).
	Retry time.Duration
}

// Ensure returns once the files hold a certificate of this node that is not due for renewal and
// the CA's file is there, requesting a certificate as long as needed.
func (r *CertRequester) Ensure(ctx context.Context) error {
	for {
		var err error
		if !r.due(time.Now()) {
			if _, err = os.Stat(r.Config.CAFile); err == nil {
				return nil
			}
			err = fmt.Errorf("waiting for the CA's certificate (the operator publishes it in the ConfigMap lockstepd-ca): %w", err)
		} else {
			err = r.request(ctx)
			if err == nil {
				continue
			}
		}
		r.Log.Error(err, "the node's certificate is not ready; retrying", "in", r.retry())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(r.retry()):
		}
	}
}

// Start renews the certificate at two thirds of its lifetime until ctx ends (a manager Runnable).
func (r *CertRequester) Start(ctx context.Context) error {
	for {
		wait := r.retry()
		if renew, err := r.renewAt(); err == nil {
			wait = time.Until(renew)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(max(wait, 0)):
		}
		if err := r.request(ctx); err != nil && ctx.Err() == nil {
			r.Log.Error(err, "renewing the node's certificate; the current one is still served", "retry in", r.retry())
		}
	}
}

func (r *CertRequester) retry() time.Duration {
	if r.Retry > 0 {
		return r.Retry
	}
	return 30 * time.Second
}

// renewAt is when the current certificate is due: at two thirds of its lifetime.
func (r *CertRequester) renewAt() (time.Time, error) {
	cert, err := ownCertificate(r.Config)
	if err != nil {
		return time.Time{}, err
	}
	life := cert.Leaf.NotAfter.Sub(cert.Leaf.NotBefore)
	return cert.Leaf.NotBefore.Add(life * 2 / 3), nil
}

// due says whether the files need a new certificate: none, an unusable one, another node's, or
// one due for renewal.
func (r *CertRequester) due(now time.Time) bool {
	at, err := r.renewAt()
	return err != nil || !now.Before(at)
}

// request asks the signer for a new certificate, waits for it, and writes the key and the
// certificate in place (the TLS configuration reads them again).
func (r *CertRequester) request(ctx context.Context) error {
	csrPEM, keyPEM, err := nodecert.NewRequest(r.Config.NodeName)
	if err != nil {
		return err
	}
	secs := int32(r.Config.CertLifetime.Seconds())
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "lockstepd-" + r.Config.NodeName + "-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request: csrPEM, SignerName: nodecert.SignerName, ExpirationSeconds: &secs,
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth, certificatesv1.UsageClientAuth},
		},
	}
	if err := r.Client.Create(ctx, csr); err != nil {
		return fmt.Errorf("requesting the node's certificate: %w", err)
	}
	r.Log.Info("requested the node's certificate", "certificatesigningrequest", csr.Name)
	certPEM, err := r.wait(ctx, csr.Name)
	if err != nil {
		return err
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		return fmt.Errorf("the signer's certificate does not match the request's key: %w", err)
	}
	// The key first: until the certificate lands, the pair on disk does not match, and the TLS
	// configuration keeps serving the previous one.
	if err := writeFile(r.Config.KeyFile, keyPEM, 0o600); err != nil {
		return err
	}
	if err := writeFile(r.Config.CertFile, certPEM, 0o644); err != nil {
		return err
	}
	r.Log.Info("the node's certificate is in place", "certificatesigningrequest", csr.Name, "file", r.Config.CertFile)
	return nil
}

// wait polls the request until the signer issued the certificate or refused it.
func (r *CertRequester) wait(ctx context.Context, name string) ([]byte, error) {
	deadline := time.Now().Add(max(r.retry(), 2*time.Minute))
	for {
		csr := &certificatesv1.CertificateSigningRequest{}
		if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, csr); err != nil {
			return nil, fmt.Errorf("reading certificatesigningrequest %s: %w", name, err)
		}
		for _, c := range csr.Status.Conditions {
			if (c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed) && c.Status == corev1.ConditionTrue {
				return nil, fmt.Errorf("certificatesigningrequest %s was %s: %s", name, c.Type, c.Message)
			}
		}
		if len(csr.Status.Certificate) > 0 {
			return csr.Status.Certificate, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("certificatesigningrequest %s is not signed yet: is lockstep-operator running? (signer %s)", name, nodecert.SignerName)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// writeFile replaces path atomically.
func writeFile(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
