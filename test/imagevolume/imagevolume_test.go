package imagevolume

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// entry is a file of a test image's layer.
type entry struct {
	name, body, link string
	mode             int64
	dir              bool
}

// archive writes an OCI archive at path with one image, named ref, of one layer of entries.
func archive(t *testing.T, path, ref string, entries ...entry) {
	t.Helper()
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Typeflag: tar.TypeReg, Size: int64(len(e.body))}
		switch {
		case e.dir:
			h.Typeflag, h.Size = tar.TypeDir, 0
		case e.link != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, e.link, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil && h.Typeflag == tar.TypeReg {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{RefAnnotation: ref})); err != nil {
		t.Fatal(err)
	}
	// The layout as a tar, as an OCI archive is.
	var out bytes.Buffer
	aw := tar.NewWriter(&out)
	err = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if info.IsDir() {
			return aw.WriteHeader(&tar.Header{Name: rel + "/", Typeflag: tar.TypeDir, Mode: 0o755})
		}
		body, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := aw.WriteHeader(&tar.Header{Name: rel, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}); err != nil {
			return err
		}
		_, err = aw.Write(body)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := aw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestPullUnpacksTheImageOncePerDigest(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.oci.tar")
	archive(t, a, "example.org/qemu:1",
		entry{name: "bin/", dir: true, mode: 0o755},
		entry{name: "bin/qemu", body: "#!/bin/true\n", mode: 0o755},
		entry{name: "share/doc/README", body: "readme", mode: 0o644},
		entry{name: "lib", link: "bin"})
	r := &Registry{Archives: []string{filepath.Join(dir, "missing.oci.tar"), a}, Dir: filepath.Join(dir, "images")}
	root, d, err := r.Pull("example.org/qemu:1")
	if err != nil {
		t.Fatal(err)
	}
	if root != filepath.Join(r.Dir, d.Hex) {
		t.Errorf("root %s, want the digest's directory", root)
	}
	for name, want := range map[string]os.FileMode{".": 0o755, "bin/qemu": 0o755, "share/doc/README": 0o644} {
		st, err := os.Stat(filepath.Join(root, name))
		if err != nil || st.Mode().Perm() != want {
			t.Errorf("%s: %v %v, want mode %o", name, st, err, want)
		}
	}
	if l, err := os.Readlink(filepath.Join(root, "lib")); err != nil || l != "bin" {
		t.Errorf("lib: %q %v, want a link to bin", l, err)
	}
	again, d2, err := r.Pull("example.org/qemu:1")
	if err != nil || again != root || d2 != d {
		t.Errorf("a second pull: %s %s %v, want the same", again, d2, err)
	}
	refs, err := (&Registry{Archives: []string{a}, Dir: r.Dir}).Refs()
	if err != nil || len(refs) != 1 || refs[0] != "example.org/qemu:1" {
		t.Errorf("refs %q %v", refs, err)
	}
	if _, _, err := r.Pull("example.org/qemu:2"); err == nil || !strings.Contains(err.Error(), "in none of") {
		t.Errorf("an image no archive has: %v", err)
	}

	// The archive made again with other files: a new digest, unpacked anew.
	archive(t, a, "example.org/qemu:1", entry{name: "bin/qemu", body: "#!/bin/false\n", mode: 0o755})
	newer, d3, err := r.Pull("example.org/qemu:1")
	if err != nil || d3 == d || newer == root {
		t.Fatalf("after the archive changed: %s %s %v", newer, d3, err)
	}
	if body, _ := os.ReadFile(filepath.Join(newer, "bin/qemu")); string(body) != "#!/bin/false\n" {
		t.Errorf("the new image's file: %q", body)
	}
}

// TestPullWritesNothingOutsideTheRoot: an image whose layer puts a file under a symlink that
// points out of the image (mutate.Extract drops such a file; extract would refuse it) writes
// nothing there.
func TestPullWritesNothingOutsideTheRoot(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.oci.tar")
	outside := t.TempDir()
	archive(t, a, "example.org/evil:1",
		entry{name: "lib", link: outside},
		entry{name: "lib/x", body: "x", mode: 0o644})
	r := &Registry{Archives: []string{a}, Dir: filepath.Join(dir, "images")}
	_, _, err := r.Pull("example.org/evil:1")
	if _, serr := os.Stat(filepath.Join(outside, "x")); serr == nil {
		t.Fatalf("the entry was written outside the root (pull: %v)", err)
	}
}

// TestExtractRefusesAnEntryThroughASymlink: extract itself refuses what would land outside.
func TestExtractRefusesAnEntryThroughASymlink(t *testing.T) {
	outside := t.TempDir()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	_ = tw.WriteHeader(&tar.Header{Name: "lib", Typeflag: tar.TypeSymlink, Linkname: outside})
	_ = tw.WriteHeader(&tar.Header{Name: "lib/x", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	_, _ = tw.Write([]byte("x"))
	_ = tw.Close()
	err := extract(tar.NewReader(&b), t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "outside the image's root") {
		t.Fatalf("extract: %v", err)
	}
	if _, serr := os.Stat(filepath.Join(outside, "x")); serr == nil {
		t.Fatal("the entry was written outside the root")
	}
}
