// Package imagevolume is the test double's image volume: what a kubelet does for a pod's volume
// of type image (Kubernetes' ImageVolume), with OCI archives standing in for a registry. Pull
// finds the image a reference names among the archives and unpacks its file system into a
// directory of its own, once per digest; the double binds that directory read-only where the pod
// mounts the volume.
package imagevolume

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// RefAnnotation names an image in an OCI archive's index.
const RefAnnotation = "org.opencontainers.image.ref.name"

// Registry is the images of a set of OCI archives, by the reference each names, unpacked
// under Dir.
type Registry struct {
	// Archives are OCI archives (as `make images` writes them).
	Archives []string
	// Dir holds the unpacked images, a directory per digest.
	Dir string

	mu sync.Mutex
}

// Pull is the root of the image that ref names, unpacked: the directory that a container mounts.
func (r *Registry) Pull(ref string) (root string, digest v1.Hash, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	img, d, err := r.lookup(ref)
	if err != nil {
		return "", v1.Hash{}, err
	}
	root = filepath.Join(r.Dir, d.Hex)
	if _, err := os.Stat(root); err == nil {
		return root, d, nil
	}
	tmp, err := os.MkdirTemp(r.Dir, ".pull-")
	if err != nil {
		return "", v1.Hash{}, err
	}
	defer func() { _ = os.RemoveAll(tmp) }() // gone once renamed
	if err := unpack(img, tmp); err != nil {
		return "", v1.Hash{}, fmt.Errorf("unpacking %s: %w", ref, err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", v1.Hash{}, err
	}
	if err := os.Rename(tmp, root); err != nil {
		if _, serr := os.Stat(root); serr != nil { // not another process's pull of it
			return "", v1.Hash{}, err
		}
	}
	return root, d, nil
}

// Config is the config of the image that ref names.
func (r *Registry) Config(ref string) (*v1.ConfigFile, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	img, _, err := r.lookup(ref)
	if err != nil {
		return nil, err
	}
	return img.ConfigFile()
}

// lookup is the image that ref names in the first archive that has it.
func (r *Registry) lookup(ref string) (v1.Image, v1.Hash, error) {
	var errs []error
	for _, a := range r.Archives {
		idx, err := r.index(a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		im, err := idx.IndexManifest()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a, err))
			continue
		}
		for _, m := range im.Manifests {
			if m.Annotations[RefAnnotation] == ref {
				img, err := idx.Image(m.Digest)
				return img, m.Digest, err
			}
		}
	}
	return nil, v1.Hash{}, fmt.Errorf("image %q is in none of %s: %w", ref, strings.Join(r.Archives, ", "), errors.Join(errs...))
}

// index is the archive's index, read from a copy of its layout under Dir that is made anew when
// the archive changed.
func (r *Registry) index(archive string) (v1.ImageIndex, error) {
	st, err := os.Stat(archive)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(r.Dir, ".layout-"+filepath.Base(archive))
	stamp, want := filepath.Join(dir, ".archive"), fmt.Sprintf("%d %s", st.Size(), st.ModTime())
	if got, err := os.ReadFile(stamp); err != nil || string(got) != want {
		if err := os.RemoveAll(dir); err != nil {
			return nil, err
		}
		f, err := os.Open(archive)
		if err != nil {
			return nil, err
		}
		err = extract(tar.NewReader(f), dir)
		_ = f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", archive, err)
		}
		if err := os.WriteFile(stamp, []byte(want), 0o644); err != nil {
			return nil, err
		}
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%s is not an OCI archive: %w", archive, err)
	}
	return idx, nil
}

// Refs are the references of the images in the archives.
func (r *Registry) Refs() ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var refs []string
	for _, a := range r.Archives {
		idx, err := r.index(a)
		if err != nil {
			return nil, err
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, err
		}
		for _, m := range im.Manifests {
			refs = append(refs, m.Annotations[RefAnnotation])
		}
	}
	return refs, nil
}

// unpack writes img's file system (its layers flattened) under dir.
func unpack(img v1.Image, dir string) error {
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	return extract(tar.NewReader(rc), dir)
}

// extract writes a tar's directories, files and symlinks under dir, with their modes. An entry
// that would land outside dir, through ".." or through a symlink written before it, is refused.
func extract(tr *tar.Reader, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.Clean("/"+h.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if parent, err := filepath.EvalSymlinks(filepath.Dir(p)); err != nil || !within(dir, parent) {
			return fmt.Errorf("%s: outside the image's root (through a symlink)", h.Name)
		}
		mode := os.FileMode(h.Mode & 0o7777)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
			if err := os.Chmod(p, mode); err != nil {
				return err
			}
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			if err := os.Chmod(p, mode); err != nil { // past the umask
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: entry of type %c", h.Name, h.Typeflag)
		}
	}
}

// within says whether p is dir or under it (both resolved).
func within(dir, p string) bool {
	d, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return false
	}
	rel, err := filepath.Rel(d, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}
