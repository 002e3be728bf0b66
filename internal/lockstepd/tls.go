package lockstepd

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/lockstep-dev/lockstep/internal/nodecert"
)

// certFiles serves the node's certificate, reading the files again when they change (lockstepd
// renews its certificate in place, the kubelet updates the CA's ConfigMap).
type certFiles struct {
	cfg  *Config
	mu   sync.Mutex
	mod  time.Time
	cert *tls.Certificate
	pool *x509.CertPool
}

func (f *certFiles) load() (*tls.Certificate, *x509.CertPool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var mod time.Time
	for _, p := range []string{f.cfg.CertFile, f.cfg.KeyFile, f.cfg.CAFile} {
		st, err := os.Stat(p)
		if err != nil {
			return nil, nil, err
		}
		if st.ModTime().After(mod) {
			mod = st.ModTime()
		}
	}
	if f.cert != nil && !mod.After(f.mod) {
		return f.cert, f.pool, nil
	}
	cert, pool, err := f.read()
	if err != nil {
		if f.cert != nil {
			// A renewal caught between its files: keep the current pair until both are in.
			return f.cert, f.pool, nil
		}
		return nil, nil, err
	}
	f.cert, f.pool, f.mod = cert, pool, mod
	return f.cert, f.pool, nil
}

// notAfter is when the certificate served now expires.
func (f *certFiles) notAfter() (time.Time, error) {
	c, _, err := f.load()
	if err != nil {
		return time.Time{}, err
	}
	return c.Leaf.NotAfter, nil
}

// ownCertificate reads the node's certificate and key, and checks that the certificate names this
// node: peers accept a node only under its own name.
func ownCertificate(cfg *Config) (tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
	if err != nil {
		return cert, err
	}
	node, err := nodecert.NodeOf(cert.Leaf)
	if err != nil {
		return cert, fmt.Errorf("%s: %w", cfg.CertFile, err)
	}
	if node != cfg.NodeName {
		return cert, fmt.Errorf("%s is the certificate of node %q, not of this node %q", cfg.CertFile, node, cfg.NodeName)
	}
	return cert, nil
}

// read reads the node's certificate (ownCertificate) and the CA's.
func (f *certFiles) read() (*tls.Certificate, *x509.CertPool, error) {
	cert, err := ownCertificate(f.cfg)
	if err != nil {
		return nil, nil, err
	}
	ca, err := os.ReadFile(f.cfg.CAFile)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, nil, fmt.Errorf("%s holds no PEM certificate", f.cfg.CAFile)
	}
	return &cert, pool, nil
}

// tlsConfig is the node's TLS configuration for both directions: it presents the node's current
// certificate and accepts peers signed by the current CA. Which node a peer must be is checked
// above it: a dialer expects the node of the pair's other member (nodecert.Expect), a server
// serves a pair only to that node (Node's peers).
func (f *certFiles) tlsConfig() (*tls.Config, error) {
	if _, _, err := f.load(); err != nil {
		return nil, err
	}
	verify := func(cs tls.ConnectionState) error {
		_, pool, err := f.load()
		if err != nil {
			return err
		}
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the peer sent no certificate")
		}
		opts := x509.VerifyOptions{Roots: pool, Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
		for _, c := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(c)
		}
		_, err = cs.PeerCertificates[0].Verify(opts)
		return err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			c, _, err := f.load()
			return c, err
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, _, err := f.load()
			return c, err
		},
		// Verification is done by VerifyConnection against the CA read from disk, which may be
		// renewed; peers are dialed by IP, so their node is checked by name above TLS.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		ClientAuth:         tls.RequireAnyClientCert,
		VerifyConnection:   verify,
	}, nil
}
