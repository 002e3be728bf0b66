// Command imagebuild builds lockstep's container image without a container daemon and without
// pulling a base image: one layer of the binaries (built by `make images`), an /etc/passwd and
// /etc/group that name the non-root user 65532, and /tmp; the non-root user, and the operator as
// the entrypoint (lockstepd's DaemonSet and the hook sidecar name their own command). It writes an
// OCI image layout as a tar (an OCI archive: `skopeo copy oci-archive:...`, `podman load`,
// `ctr image import`). Everything in it has fixed owners, modes and times, so the same binaries
// make the same image digest.
//
//	go run ./hack/imagebuild -bin bin/image -out bin/images/lockstep.oci.tar -ref ghcr.io/lockstep-dev/lockstep-operator:dev
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Binaries are the image's programs, at its root.
var Binaries = []string{"lockstep-operator", "lockstepd", "lockstep-kubevirt-hook"}

// User is the non-root user the image runs as (distroless's nonroot).
const User = "65532:65532"

// epoch is the time of every file and of the image: a fixed one, for reproducible digests.
var epoch = time.Unix(0, 0).UTC()

func main() {
	bin := flag.String("bin", "bin/image", "Directory of the linux/amd64 binaries.")
	out := flag.String("out", "bin/images/lockstep.oci.tar", "The OCI archive to write.")
	ref := flag.String("ref", "ghcr.io/lockstep-dev/lockstep-operator:dev", "The image's name, recorded in the archive's index.")
	version := flag.String("version", "dev", "The version label.")
	flag.Parse()
	if err := build(*bin, *out, *ref, *version); err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(1)
	}
}

func build(bin, out, ref, version string) error {
	layerTar, err := rootfs(bin)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: epoch}, CreatedBy: "hack/imagebuild", Comment: "lockstep binaries",
	}})
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: epoch}
	cf.Config.User = User
	cf.Config.Entrypoint = []string{"/lockstep-operator"}
	cf.Config.WorkingDir = "/"
	cf.Config.Env = []string{"PATH=/"}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":    "lockstep",
		"org.opencontainers.image.source":   "https://github.com/lockstep-dev/lockstep",
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.licenses": "Apache-2.0",
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	dir, err := os.MkdirTemp(filepath.Dir(out), ".oci-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
		return err
	}
	return tarDir(dir, out)
}

// rootfs is the layer: the binaries, the user's passwd and group entries, and /tmp.
func rootfs(bin string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, body []byte) error {
		h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname, h.Format = epoch, 0, 0, "", "", tar.FormatPAX
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(body)
		return err
	}
	dirs := []struct {
		name string
		mode int64
	}{{"etc/", 0o755}, {"tmp/", 0o1777}}
	for _, d := range dirs {
		if err := add(&tar.Header{Name: d.name, Typeflag: tar.TypeDir, Mode: d.mode}, nil); err != nil {
			return nil, err
		}
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
		"etc/group":  "root:x:0:\nnonroot:x:65532:\n",
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := add(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644}, []byte(files[n])); err != nil {
			return nil, err
		}
	}
	for _, b := range Binaries {
		body, err := os.ReadFile(filepath.Join(bin, b))
		if err != nil {
			return nil, fmt.Errorf("%w (make images builds the binaries first)", err)
		}
		if err := add(&tar.Header{Name: b, Typeflag: tar.TypeReg, Mode: 0o755}, body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarDir writes the OCI layout in dir as a tar at out, in a fixed order with fixed times.
func tarDir(dir, out string) error {
	var paths []string
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, p := range paths {
		info, err := os.Stat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: epoch, Mode: 0o644, Format: tar.FormatPAX}
		if info.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			continue
		}
		body, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		h.Typeflag, h.Size = tar.TypeReg, int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(body); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(out+".tmp", out)
}
