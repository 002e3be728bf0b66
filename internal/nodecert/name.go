// Package nodecert is each lockstepd's identity on the logging network: a certificate that names
// its node, issued by the operator's signer (lockstep.dev/lockstepd) only to the lockstepd whose
// ServiceAccount token is bound to that node. It names the identity, reviews a request, signs,
// and checks a peer against the node the API says it must be. It is pure: no Kubernetes, no I/O.
package nodecert

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
)

// SignerName is the Kubernetes CertificateSigningRequest signer of lockstepd's certificates.
const SignerName = "lockstep.dev/lockstepd"

// prefix begins the common name of a node's certificate, as the kubelet's begins with
// "system:node:".
const prefix = "system:lockstepd:"

// CommonName is the subject common name of node's certificate.
func CommonName(node string) string { return prefix + node }

// NodeOf is the node that a certificate names, or an error if it names none.
func NodeOf(cert *x509.Certificate) (string, error) {
	node, ok := strings.CutPrefix(cert.Subject.CommonName, prefix)
	if !ok || node == "" {
		return "", fmt.Errorf("the certificate %q names no lockstepd node (want the common name %q)", cert.Subject.CommonName, CommonName("<node>"))
	}
	return node, nil
}

// PeerNode is the node that the peer of a verified TLS connection is.
func PeerNode(cs tls.ConnectionState) (string, error) {
	if len(cs.PeerCertificates) == 0 {
		return "", errors.New("the peer sent no certificate")
	}
	return NodeOf(cs.PeerCertificates[0])
}

// Authorizer decides whether node's lockstepd may serve pair: only the node that holds the pair's
// other member may.
type Authorizer func(pair, node string) error

// Check applies the authorizer to the peer of a verified TLS connection; a nil Authorizer
// accepts every peer the CA signed.
func (a Authorizer) Check(cs tls.ConnectionState, pair string) error {
	if a == nil {
		return nil
	}
	node, err := PeerNode(cs)
	if err != nil {
		return err
	}
	return a(pair, node)
}

// ErrWrongNode is wrapped by the error of a peer that is not the node expected.
var ErrWrongNode = errors.New("the peer is not the expected node")

// Expect returns a copy of c that, on top of c's own verification, accepts only a peer whose
// certificate names node: the dialing side of a pair knows which node holds the other member.
// With no node it returns c: any certificate that c's CA signed.
func Expect(c *tls.Config, node string) *tls.Config {
	if node == "" {
		return c
	}
	c = c.Clone()
	verify := c.VerifyConnection
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if verify != nil {
			if err := verify(cs); err != nil {
				return err
			}
		}
		got, err := PeerNode(cs)
		if err != nil {
			return err
		}
		if got != node {
			return fmt.Errorf("%w: it is lockstepd of node %q, the pair's other member is on %q", ErrWrongNode, got, node)
		}
		return nil
	}
	return c
}
