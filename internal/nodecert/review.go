package nodecert

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
)

// NodeNameExtra is the user extra in which the API server names the node of a ServiceAccount
// token bound to a pod (the kubelet mounts such tokens).
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// Usages a lockstepd certificate may ask for, as the CertificateSigningRequest API spells them:
// it serves and dials on the logging network.
var Usages = []string{"digital signature", "server auth", "client auth"}

// Request is what the signer reviews of a CertificateSigningRequest: who asked (as the API
// server authenticated them) and what they asked for.
type Request struct {
	// Username and Extra are the requester, from the API server.
	Username string
	Extra    map[string][]string
	// CSR is the PKCS#10 request (PEM), Usages its key usages.
	CSR    []byte
	Usages []string
}

// Review decides whether the requester may have the certificate it asks for, and returns the
// node it is for. The requester must be serviceAccount (lockstepd's, "system:serviceaccount:
// <namespace>:<name>") with a token bound to a pod on a node, and ask for that node's name and
// nothing else: a lockstepd gets a certificate for its own node only. The error says what is
// wrong, for the request's Denied condition.
func Review(r Request, serviceAccount string) (string, error) {
	if r.Username != serviceAccount {
		return "", fmt.Errorf("only %s may request a lockstepd certificate, not %s", serviceAccount, r.Username)
	}
	nodes := r.Extra[NodeNameExtra]
	if len(nodes) != 1 || nodes[0] == "" {
		return "", errors.New("the requester's token is not bound to a pod on a node (the kubelet's projected token is)")
	}
	node := nodes[0]
	csr, err := ParseCSR(r.CSR)
	if err != nil {
		return "", err
	}
	if got := csr.Subject.CommonName; got != CommonName(node) {
		return "", fmt.Errorf("lockstepd of node %s may ask only for the common name %q, not %q", node, CommonName(node), got)
	}
	if len(csr.Subject.Organization)+len(csr.Subject.OrganizationalUnit) > 0 || len(csr.DNSNames)+len(csr.IPAddresses)+len(csr.EmailAddresses)+len(csr.URIs) > 0 {
		return "", errors.New("a lockstepd certificate names its node in the common name only: no organization, DNS names, addresses or URIs")
	}
	for _, u := range r.Usages {
		if !slices.Contains(Usages, u) {
			return "", fmt.Errorf("usage %q is not one of %v", u, Usages)
		}
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey, ed25519.PublicKey:
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return "", fmt.Errorf("an RSA key of %d bits is too short (at least 2048)", k.N.BitLen())
		}
	default:
		return "", fmt.Errorf("unsupported key type %T", k)
	}
	return node, nil
}

// ParseCSR reads a PEM PKCS#10 request and checks its signature.
func ParseCSR(p []byte) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(p)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("the request holds no PEM CERTIFICATE REQUEST")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the request does not parse: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("the request's signature is invalid: %w", err)
	}
	return csr, nil
}
