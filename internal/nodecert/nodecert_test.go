package nodecert_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/nodecert"
)

const sa = "system:serviceaccount:lockstep-system:lockstepd"

func request(t *testing.T, tmpl *x509.CertificateRequest) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func TestReview(t *testing.T) {
	own, _, err := nodecert.NewRequest("node-a")
	if err != nil {
		t.Fatal(err)
	}
	bound := map[string][]string{nodecert.NodeNameExtra: {"node-a"}}
	tests := []struct {
		name string
		req  nodecert.Request
		want string // "" accepted; else a part of the error
	}{
		{"its own node", nodecert.Request{Username: sa, Extra: bound, CSR: own, Usages: nodecert.Usages}, ""},
		{"another node's name", nodecert.Request{Username: sa, Extra: map[string][]string{nodecert.NodeNameExtra: {"node-b"}}, CSR: own}, `may ask only for the common name "system:lockstepd:node-b"`},
		{"a token bound to no node", nodecert.Request{Username: sa, CSR: own}, "not bound to a pod on a node"},
		{"another requester", nodecert.Request{Username: "system:serviceaccount:default:default", Extra: bound, CSR: own}, "only " + sa},
		{"a DNS name too", nodecert.Request{Username: sa, Extra: bound, CSR: request(t, &x509.CertificateRequest{Subject: pkix.Name{CommonName: nodecert.CommonName("node-a")}, DNSNames: []string{"x"}})}, "common name only"},
		{"an organization", nodecert.Request{Username: sa, Extra: bound, CSR: request(t, &x509.CertificateRequest{Subject: pkix.Name{CommonName: nodecert.CommonName("node-a"), Organization: []string{"system:masters"}}})}, "common name only"},
		{"a usage it does not need", nodecert.Request{Username: sa, Extra: bound, CSR: own, Usages: []string{"client auth", "code signing"}}, `usage "code signing"`},
		{"not a request", nodecert.Request{Username: sa, Extra: bound, CSR: []byte("junk")}, "no PEM CERTIFICATE REQUEST"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			node, err := nodecert.Review(tt.req, sa)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want == "" && node != "node-a":
				t.Fatalf("node %q, want node-a", node)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}

// pair issues a certificate for node from ca and returns its TLS configuration, which trusts ca.
func pair(t *testing.T, ca *nodecert.CA, node string) *tls.Config {
	t.Helper()
	csr, key, err := nodecert.NewRequest(node)
	if err != nil {
		t.Fatal(err)
	}
	crt, err := ca.Sign(csr, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(crt, key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert,
		ServerName: "ignored", InsecureSkipVerify: true, MinVersion: tls.VersionTLS13} //nolint:gosec // the test checks the node, as Expect does
}

func TestSignedCertificatesNameTheirNodeAndExpectChecksIt(t *testing.T) {
	now := time.Now()
	caPEM, keyPEM, err := nodecert.NewCA(now, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := nodecert.ParseCA(caPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	csr, _, _ := nodecert.NewRequest("node-a")
	crt, err := ca.Sign(csr, now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(crt)
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if node, err := nodecert.NodeOf(cert); err != nil || node != "node-a" {
		t.Fatalf("NodeOf = %q, %v", node, err)
	}
	if !cert.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Fatalf("the certificate outlives its CA: %v > %v", cert.NotAfter, ca.Cert.NotAfter)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("the certificate does not verify against its CA: %v", err)
	}

	server := pair(t, ca, "node-b")
	for _, tt := range []struct {
		expect string
		ok     bool
	}{{"node-b", true}, {"node-c", false}} {
		client := nodecert.Expect(pair(t, ca, "node-a"), tt.expect)
		c1, c2 := net.Pipe()
		errs := make(chan error, 1)
		go func() { errs <- tls.Server(c2, server).Handshake() }()
		err := tls.Client(c1, client).Handshake()
		_ = c1.Close()
		<-errs
		if tt.ok != (err == nil) || (!tt.ok && !errors.Is(err, nodecert.ErrWrongNode)) {
			t.Fatalf("expecting %s: handshake err %v", tt.expect, err)
		}
	}
}
