// Package pki makes, in memory, a CA and the per-node certificates that the operator's signer
// issues to lockstepd in a cluster, for tests: TLS configurations, or the files lockstepd reads
// (tls.crt, tls.key, ca.crt); and key pairs for other programs a test runs.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/nodecert"
)

// CA is a certificate authority.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	Pool *x509.CertPool
}

// New makes a CA.
func New(tb testing.TB, name string) *CA {
	tb.Helper()
	ca, err := NewCA(name)
	if err != nil {
		tb.Fatal(err)
	}
	return ca
}

// NewCA makes a CA, for a caller without a testing.TB (a TestMain).
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{cert: cert, key: key, Pool: pool}, nil
}

// PEM is the CA's certificate, as a caBundle or a CA file holds it.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})
}

// WriteKeyPair issues a server-and-client certificate named cn, valid for dnsNames and
// 127.0.0.1, and writes it and its key as PEM to certFile and keyFile: for a program that reads
// its certificate from files (an API server's front proxy, KubeVirt's virt-api).
func (ca *CA) WriteKeyPair(certFile, keyFile, cn string, dnsNames ...string) error {
	der, key, err := ca.sign(cn, dnsNames...)
	if err != nil {
		return err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
}

// issue makes a server-and-client certificate for node's lockstepd, as the operator's signer
// issues it (its common name names the node; nodecert), with the DNS name "lockstepd".
func (ca *CA) issue(tb testing.TB, node string) ([]byte, *ecdsa.PrivateKey) {
	tb.Helper()
	der, key, err := ca.sign(nodecert.CommonName(node), "lockstepd")
	if err != nil {
		tb.Fatal(err)
	}
	return der, key
}

// sign makes a server-and-client certificate named cn, valid for dnsNames and 127.0.0.1, for a
// day, and its key.
func (ca *CA) sign(cn string, dnsNames ...string) ([]byte, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		DNSNames: dnsNames, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, err
	}
	return der, key, nil
}

// TLSConfig issues a certificate for node and returns a TLS configuration that presents it,
// trusts only this CA and expects the peer to be named "lockstepd".
func (ca *CA) TLSConfig(tb testing.TB, node string) *tls.Config {
	tb.Helper()
	der, key := ca.issue(tb, node)
	return &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		RootCAs:      ca.Pool, ClientCAs: ca.Pool, ServerName: "lockstepd",
	}
}

// WriteFiles issues a certificate for node and writes tls.crt, tls.key and ca.crt into dir, as
// lockstepd keeps them (its certificate and key, and the CA's certificate that the operator
// publishes).
func (ca *CA) WriteFiles(tb testing.TB, dir, node string) {
	tb.Helper()
	der, key := ca.issue(tb, node)
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	files := map[string]*pem.Block{
		"tls.crt": {Type: "CERTIFICATE", Bytes: der},
		"tls.key": {Type: "EC PRIVATE KEY", Bytes: kb},
		"ca.crt":  {Type: "CERTIFICATE", Bytes: ca.cert.Raw},
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	for f, b := range files {
		if err := os.WriteFile(filepath.Join(dir, f), pem.EncodeToMemory(b), 0o600); err != nil {
			tb.Fatal(err)
		}
	}
}
