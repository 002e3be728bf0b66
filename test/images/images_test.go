// Package images tests the images that `make images` builds: lockstep's
// (bin/images/lockstep.oci.tar), an OCI archive whose one image runs as the non-root user with
// the operator as its entrypoint, and whose binaries run; and lockstep's QEMU
// (bin/images/lockstep-qemu.oci.tar, qemu_test.go). It reads each archive as a container runtime
// would (its index, manifest, config and layer), with no container daemon.
package images

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/lockstep-dev/lockstep/test/imagevolume"
)

const archive = "../../bin/images/lockstep.oci.tar"

func TestImage(t *testing.T) {
	dir := t.TempDir()
	untar(t, archive, dir, nil)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("%s is not an OCI archive (make images): %v", archive, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] == "" {
		t.Fatalf("want one named image, got %+v", im.Manifests)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("user %q, want the non-root 65532:65532", cf.Config.User)
	}
	if got := strings.Join(cf.Config.Entrypoint, " "); got != "/lockstep-operator" {
		t.Errorf("entrypoint %q", got)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rc.Close() }()
	root := t.TempDir()
	modes := map[string]int64{}
	untarReader(t, rc, root, modes)
	if modes["tmp/"] != 0o1777 {
		t.Errorf("/tmp mode %o", modes["tmp/"])
	}
	passwd, err := os.ReadFile(filepath.Join(root, "etc", "passwd"))
	if err != nil || !strings.Contains(string(passwd), ":65532:65532:") {
		t.Errorf("/etc/passwd does not name user 65532: %q %v", passwd, err)
	}
	// Each binary runs from the image's layer: the entrypoint's, lockstepd's and the hook's
	// commands as the manifests name them (-help lists their flags and exits 0).
	for _, b := range []struct{ name, flag string }{
		{"lockstep-operator", "--webhook-cert-dir"},
		{"lockstepd", "--logging-interface"},
		{"lockstep-kubevirt-hook", "--plugin-socket"},
	} {
		if modes[b.name] != 0o755 {
			t.Errorf("/%s mode %o", b.name, modes[b.name])
		}
		out, err := exec.Command(filepath.Join(root, b.name), "-help").CombinedOutput()
		if err != nil {
			t.Errorf("/%s -help: %v\n%s", b.name, err, out)
			continue
		}
		if !strings.Contains(string(out), strings.TrimPrefix(b.flag, "-")) {
			t.Errorf("/%s -help does not list %s:\n%s", b.name, b.flag, out)
		}
		// The version the build stamped, which the image's label names too.
		out, err = exec.Command(filepath.Join(root, b.name), "--version").CombinedOutput()
		if want := b.name + " " + cf.Config.Labels["org.opencontainers.image.version"] + "\n"; err != nil || string(out) != want {
			t.Errorf("/%s --version: %q %v, want %q", b.name, out, err, want)
		}
	}
}

// versionLabel is the version label of the one image of an OCI archive, which building it again
// must give it.
func versionLabel(t *testing.T, path string) string {
	t.Helper()
	reg := &imagevolume.Registry{Archives: []string{path}, Dir: t.TempDir()}
	refs, err := reg.Refs()
	if err != nil || len(refs) != 1 {
		t.Fatalf("%s: %q %v", path, refs, err)
	}
	cf, err := reg.Config(refs[0])
	if err != nil {
		t.Fatal(err)
	}
	return cf.Config.Labels["org.opencontainers.image.version"]
}

// TestImageIsReproducible builds the image again from the same binaries: the same digest.
func TestImageIsReproducible(t *testing.T) {
	again := filepath.Join(t.TempDir(), "again.oci.tar")
	cmd := exec.Command("go", "run", "./hack/imagebuild", "-bin", "bin/image", "-out", again, "-version", versionLabel(t, archive))
	cmd.Dir = filepath.Join("..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if a, b := indexDigest(t, archive), indexDigest(t, again); a != b {
		t.Fatalf("two builds of the same binaries: %s and %s", a, b)
	}
}

// indexDigest is the digest of the one image of an OCI archive.
func indexDigest(t *testing.T, path string) string {
	t.Helper()
	dir := t.TempDir()
	untar(t, path, dir, nil)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("%v %v", im, err)
	}
	return im.Manifests[0].Digest.String()
}

func untar(t *testing.T, path, dir string, modes map[string]int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("%v (make images)", err)
	}
	defer func() { _ = f.Close() }()
	untarReader(t, f, dir, modes)
}

func untarReader(t *testing.T, r io.Reader, dir string, modes map[string]int64) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if modes != nil {
			modes[h.Name] = h.Mode
		}
		p := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, body, os.FileMode(h.Mode&0o777)); err != nil {
				t.Fatal(err)
			}
		}
	}
}
