package lockstepd

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/test/pki"
)

// TestCertificateIsDueAtTwoThirdsOrWhenItIsNotThisNodes: a certificate of this node is renewed
// at two thirds of its lifetime; none, or another node's, is replaced at once.
func TestCertificateIsDueAtTwoThirdsOrWhenItIsNotThisNodes(t *testing.T) {
	dir := t.TempDir()
	c := &Config{NodeName: "node-1", CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}
	r := &CertRequester{Config: c}
	if !r.due(time.Now()) {
		t.Fatal("no certificate is not due")
	}
	pki.New(t, "ca").WriteFiles(t, dir, "node-1") // valid from an hour ago for 25 hours
	at, err := r.renewAt()
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Now().Add(-time.Hour + 25*time.Hour*2/3); at.Sub(want).Abs() > time.Minute {
		t.Fatalf("renewal at %v, want about %v", at, want)
	}
	if r.due(time.Now()) || !r.due(time.Now().Add(16*time.Hour)) {
		t.Fatal("a fresh certificate is due, or one past two thirds of its lifetime is not")
	}
	pki.New(t, "ca").WriteFiles(t, dir, "node-2")
	if !r.due(time.Now()) {
		t.Fatal("another node's certificate is not due")
	}
}
