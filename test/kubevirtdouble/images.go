package kubevirtdouble

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// The sizes of the images the launcher attaches, as KubeVirt and CDI make them. They differ from
// one another and from the claims' sizes, as on a real cluster, so that a member whose images
// COLO cannot pair fails here as it would there.

// mib is the unit both KubeVirt and CDI align images to.
const mib = 1 << 20

// cdiFilesystemOverhead is CDI's default share of a filesystem claim its filesystem takes
// (CDIConfig filesystemOverhead.global), which an imported image does not get.
const cdiFilesystemOverhead = 0.055

func alignDown(n int64) int64 { return n / mib * mib }

// importedSize is the size of an image CDI imports into a claim of request bytes: the claim's
// usable space (less the filesystem overhead) in whole MiB; CDI grows the image to fill it.
func importedSize(request int64) int64 {
	return alignDown(int64(float64(request) * (1 - cdiFilesystemOverhead)))
}

// blankSize is the size of the disk.img KubeVirt makes on a claim that has none: the claim's
// size in whole MiB (its capacity when smaller than its request; the double's claims have no
// volume, so their request; a real one's free space can make it smaller still).
func blankSize(request int64) int64 { return alignDown(request) }

// emptyDiskSize is the size of the qcow2 image KubeVirt makes for an emptyDisk: its capacity
// rounded down to whole MiB.
func emptyDiskSize(capacity int64) int64 { return alignDown(capacity) }

// claimImage makes the image of a claim that has none: the guest's image as CDI imports it, for
// the first claim of a VMI that is the user's (a DataVolume of the guest); otherwise blank, as
// KubeVirt makes it (a new claim, a blank DataVolume, or a copy the operator made).
func (d *Domains) claimImage(ctx context.Context, namespace, claim, image string, first bool) error {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := d.Hosts.Get(ctx, types.NamespacedName{Namespace: namespace, Name: claim}, pvc); err != nil {
		return fmt.Errorf("claim %s: %w", claim, err)
	}
	request := pvc.Spec.Resources.Requests.Storage().Value()
	if err := os.MkdirAll(filepath.Dir(image), 0o755); err != nil {
		return err
	}
	if !first || pvc.Labels[ftv1.LabelManagedBy] == ftv1.ManagedByValue {
		return d.qemuImg("raw", image, blankSize(request))
	}
	guest := filepath.Join(d.Guest, "disk.img")
	st, err := os.Stat(guest)
	if err != nil {
		return err
	}
	size := importedSize(request)
	if st.Size() > size {
		return fmt.Errorf("claim %s: the guest's image (%d bytes) does not fit its usable space (%d bytes of %d)", claim, st.Size(), size, request)
	}
	if out, err := exec.Command("cp", "--sparse=always", guest, image).CombinedOutput(); err != nil {
		return fmt.Errorf("the claim's image from the guest's: %w: %s", err, out)
	}
	return os.Truncate(image, size)
}

// emptyDiskImage makes the image of an emptyDisk volume.
func (d *Domains) emptyDiskImage(v *virtv1.EmptyDiskSource, image string) error {
	size := emptyDiskSize(v.Capacity.Value())
	if size == 0 {
		return fmt.Errorf("the emptyDisk's capacity %s is less than 1 MiB", v.Capacity.String())
	}
	return d.qemuImg("qcow2", image, size)
}

// qemuImg makes an image of size bytes.
func (d *Domains) qemuImg(format, image string, size int64) error {
	if out, err := exec.Command(filepath.Join(d.QEMU, "bin", "qemu-img"), "create", "-f", format, image, fmt.Sprint(size)).CombinedOutput(); err != nil {
		return fmt.Errorf("qemu-img: %w: %s", err, out)
	}
	return nil
}
