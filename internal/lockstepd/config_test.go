package lockstepd

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/test/pki"
)

func TestFlagsFromEnvironmentAndCommandLine(t *testing.T) {
	fs := flag.NewFlagSet("lockstepd", flag.ContinueOnError)
	var c Config
	c.BindFlags(fs)
	t.Setenv("LOCKSTEPD_NODE_NAME", "node-7")
	t.Setenv("LOCKSTEPD_DETECT", "250ms")
	t.Setenv("LOCKSTEPD_ADVERTISE_ADDRESS", "10.0.0.7:7410")
	if err := fs.Parse([]string{"--advertise-address", "192.0.2.7:7410"}); err != nil {
		t.Fatal(err)
	}
	if err := FromEnv(fs); err != nil {
		t.Fatal(err)
	}
	if c.NodeName != "node-7" || c.Detect != 250*time.Millisecond {
		t.Fatalf("the environment was not applied: %+v", c)
	}
	if c.AdvertiseAddress != "192.0.2.7:7410" {
		t.Fatalf("the command line must win over the environment: %s", c.AdvertiseAddress)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.StreamAdvertiseAddress != "192.0.2.7:7411" {
		t.Fatalf("the stream address is the advertised host with the stream listener's port: %q", c.StreamAdvertiseAddress)
	}

	t.Setenv("LOCKSTEPD_HEARTBEAT", "a while")
	if err := FromEnv(fs); err == nil || !strings.Contains(err.Error(), "LOCKSTEPD_HEARTBEAT") {
		t.Fatalf("a bad variable must be named: %v", err)
	}
}

func TestValidateNamesEveryProblem(t *testing.T) {
	c := Config{Heartbeat: time.Second, Detect: 500 * time.Millisecond, GateHook: "postrouting"}
	err := c.Validate()
	if err == nil {
		t.Fatal("an empty configuration passed")
	}
	for _, want := range []string{"--node-name", "--advertise-address", "--detect", "--gate-hook"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not name %s: %v", want, err)
		}
	}
}

// TestCertificatesAreReadAgainWhenRenewed replaces the files (as lockstepd renews its certificate
// and the kubelet updates the CA's ConfigMap): the next handshake presents the new certificate
// and trusts the new CA.
func TestCertificatesAreReadAgainWhenRenewed(t *testing.T) {
	dir := t.TempDir()
	pki.New(t, "ca-1").WriteFiles(t, dir, "node-1")
	c := Config{NodeName: "node-1", CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"), CAFile: filepath.Join(dir, "ca.crt")}
	files := &certFiles{cfg: &c}
	first, pool1, err := files.load()
	if err != nil {
		t.Fatal(err)
	}
	if again, _, _ := files.load(); again != first {
		t.Fatal("unchanged files were read again")
	}
	time.Sleep(10 * time.Millisecond) // a newer modification time
	pki.New(t, "ca-2").WriteFiles(t, dir, "node-1")
	now := time.Now()
	for _, f := range []string{c.CertFile, c.KeyFile, c.CAFile} {
		if err := os.Chtimes(f, now, now); err != nil {
			t.Fatal(err)
		}
	}
	second, pool2, err := files.load()
	if err != nil {
		t.Fatal(err)
	}
	if second == first || pool2.Equal(pool1) {
		t.Fatal("renewed files were not read again")
	}
}

// TestAnotherNodesCertificateIsRefused: lockstepd does not start with a certificate that names
// another node (peers would refuse it), and says which node the files are for.
func TestAnotherNodesCertificateIsRefused(t *testing.T) {
	dir := t.TempDir()
	pki.New(t, "ca").WriteFiles(t, dir, "node-2")
	c := Config{NodeName: "node-1", CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"), CAFile: filepath.Join(dir, "ca.crt")}
	_, err := (&certFiles{cfg: &c}).tlsConfig()
	if err == nil || !strings.Contains(err.Error(), `the certificate of node "node-2", not of this node "node-1"`) {
		t.Fatalf("got %v", err)
	}
}

// TestLoggingInterfaceBindsEverything: with --logging-interface, the listeners that name no host
// bind to that interface's address only, and it is what peers are told to dial.
func TestLoggingInterfaceBindsEverything(t *testing.T) {
	c := DefaultConfig()
	c.NodeName, c.LoggingInterface = "node-1", "lo"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.ListenAddress != "127.0.0.1:7410" || c.AdvertiseAddress != "127.0.0.1:7410" ||
		c.StreamListenAddress != "127.0.0.1:7411" || c.StreamAdvertiseAddress != "127.0.0.1:7411" {
		t.Fatalf("not bound to the logging interface: %+v", c)
	}
	c = DefaultConfig()
	c.NodeName, c.LoggingInterface = "node-1", "no-such-if0"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--logging-interface no-such-if0") {
		t.Fatalf("a missing interface must be named: %v", err)
	}
}
