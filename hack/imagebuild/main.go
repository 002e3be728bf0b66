// Command imagebuild builds lockstep's container images without a container daemon and without
// pulling a base image. It writes each as an OCI image layout in a tar (an OCI archive: `skopeo
// copy oci-archive:...`, `podman load`, `ctr image import`). Everything in it has fixed owners,
// modes and times, so the same files make the same image digest.
//
// With -bin, lockstep's image: one layer of the binaries (built by `make images`), an /etc/passwd
// and /etc/group that name the non-root user 65532, and /tmp; the non-root user, and the operator
// as the entrypoint (lockstepd's DaemonSet and the hook sidecar name their own command).
//
//	go run ./hack/imagebuild -bin bin/image -out bin/images/lockstep.oci.tar -ref ghcr.io/lockstep-dev/lockstep-operator:dev
//
// With -root, lockstep's QEMU image: one layer of the directory that hack/qemu-image.sh
// assembles, as it is. It is not run but mounted, as a Kubernetes image volume, into each
// member's compute container at -mount, the path its binary's interpreter names; so it has no
// entrypoint, and its user is QEMU's in KubeVirt's launcher (107).
//
//	go run ./hack/imagebuild -root bin/qemu-image -mount /usr/local/lockstep -out bin/images/lockstep-qemu.oci.tar -ref ghcr.io/lockstep-dev/lockstep-qemu:dev
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
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

// User is the non-root user lockstep's image runs as (distroless's nonroot).
const User = "65532:65532"

// QEMUUser is the user of the QEMU image: the one KubeVirt's launcher runs QEMU as.
const QEMUUser = "107:107"

// MountLabel names, in the QEMU image's config, the path where it must be mounted.
const MountLabel = "dev.lockstep.mount-path"

// epoch is the time of every file and of the image: a fixed one, for reproducible digests.
var epoch = time.Unix(0, 0).UTC()

func main() {
	bin := flag.String("bin", "", "Directory of the linux/amd64 binaries: build lockstep's image.")
	root := flag.String("root", "", "Directory of lockstep's QEMU (hack/qemu-image.sh): build the QEMU image (needs -mount, -out and -ref).")
	mount := flag.String("mount", "", "With -root: where the image is mounted (its binary's interpreter is there).")
	out := flag.String("out", "", "The OCI archive to write (with -bin, default bin/images/lockstep.oci.tar).")
	ref := flag.String("ref", "", "The image's name, recorded in the archive's index (with -bin, default ghcr.io/lockstep-dev/lockstep-operator:dev).")
	version := flag.String("version", "dev", "The version label.")
	flag.Parse()
	var err error
	switch {
	case (*bin == "") == (*root == ""):
		err = errors.New("give one of -bin and -root")
	case *bin != "":
		err = build(lockstepImage(*bin, *version), or(*out, "bin/images/lockstep.oci.tar"), or(*ref, "ghcr.io/lockstep-dev/lockstep-operator:dev"))
	case *mount == "" || *out == "" || *ref == "":
		err = errors.New("-root needs -mount, -out and -ref: the QEMU image has no defaults of the operator's")
	default:
		err = build(qemuImage(*root, *mount, *version), *out, *ref)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(1)
	}
}

func or(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// image is what differs between the two images: the layer, what it is, and how it runs.
type image struct {
	layer   func() ([]byte, error)
	comment string
	config  v1.Config
}

func lockstepImage(bin, version string) image {
	return image{layer: func() ([]byte, error) { return rootfs(bin) }, comment: "lockstep binaries", config: v1.Config{
		User: User, Entrypoint: []string{"/lockstep-operator"}, WorkingDir: "/", Env: []string{"PATH=/"},
		Labels: map[string]string{
			"org.opencontainers.image.title":    "lockstep",
			"org.opencontainers.image.source":   "https://github.com/lockstep-dev/lockstep",
			"org.opencontainers.image.version":  version,
			"org.opencontainers.image.licenses": "Apache-2.0",
		},
	}}
}

func qemuImage(root, mount, version string) image {
	return image{layer: func() ([]byte, error) { return dirLayer(root) }, comment: "lockstep's QEMU, its libraries and firmware", config: v1.Config{
		User: QEMUUser, WorkingDir: "/",
		Labels: map[string]string{
			"org.opencontainers.image.title":       "lockstep-qemu",
			"org.opencontainers.image.description": "QEMU with lockstep's COLO patches, with its libraries and firmware, mounted at " + mount + " in FT members' launchers; licences under share/doc",
			"org.opencontainers.image.source":      "https://github.com/lockstep-dev/lockstep",
			"org.opencontainers.image.version":     version,
			MountLabel:                             mount,
		},
	}}
}

func build(spec image, out, ref string) error {
	layerTar, err := spec.layer()
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
		Created: v1.Time{Time: epoch}, CreatedBy: "hack/imagebuild", Comment: spec.comment,
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
	cf.Config = spec.config
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
	if err := tarDir(dir, out); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	// On stderr, so that a script's stdout stays its own: the digest is what to pin.
	fmt.Fprintf(os.Stderr, "imagebuild: %s: %s@%s\n", out, ref, digest)
	return nil
}

// dirLayer is a layer of the tree under root as it is (its files' modes and symlinks), with
// fixed owners (root) and times, in name order.
func dirLayer(root string) ([]byte, error) {
	root, err := filepath.EvalSymlinks(root) // bin/qemu-image is a link to the cache
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: int64(info.Mode().Perm()), ModTime: epoch, Format: tar.FormatPAX}
		var body []byte
		switch {
		case d.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case info.Mode()&fs.ModeSymlink != 0:
			if h.Linkname, err = os.Readlink(p); err != nil {
				return err
			}
			h.Typeflag = tar.TypeSymlink
		case info.Mode().IsRegular():
			if body, err = os.ReadFile(p); err != nil {
				return err
			}
			h.Typeflag, h.Size = tar.TypeReg, int64(len(body))
		default:
			return fmt.Errorf("%s: neither a file, a directory nor a symlink", p)
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err = tw.Write(body)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
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
