package member

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// Disk sizes under COLO. QEMU pairs a primary's disk only with images of exactly its size: the
// resync's mirror refuses a target of another size, and the secondary's replication driver
// refuses to start unless its replica and both overlays have one length. Nothing on a real
// cluster makes them equal by itself: CDI imports a disk at about the claim's size less its
// filesystem overhead, KubeVirt makes a new claim's disk.img as large as the claim (or its free
// space), and storage classes round claims up. So the VM's disk sizes are measured where the VM
// runs (lockstepd reads them from the primary's QEMU: AnnotationMeasuredDiskBytes), and every
// secondary is built from them: its copies are claims large enough to hold the disk, whose
// images the hook opens at exactly the disk's size, and its overlays are emptyDisks of it.

// MiB is the unit KubeVirt makes emptyDisk images in: it rounds their capacity down to it.
const MiB = 1 << 20

// FilesystemOverhead is the share of a filesystem claim that its filesystem takes, which the
// image cannot use: a copy's claim asks for that much more than the disk it holds. It is CDI's
// default (its CDIConfig's filesystemOverhead.global).
const FilesystemOverhead = 0.055

// DiskBytes is the size in bytes of each replicated disk of a VM, by volume.
type DiskBytes map[string]int64

// String is the annotations' form: "<volume>=<bytes>", comma-separated, sorted by volume.
func (b DiskBytes) String() string {
	parts := make([]string, 0, len(b))
	for v, n := range b {
		parts = append(parts, v+"="+strconv.FormatInt(n, 10))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// ParseDiskBytes reads AnnotationDiskBytes or AnnotationMeasuredDiskBytes from a member VMI.
func ParseDiskBytes(s string) (DiskBytes, error) {
	b := DiskBytes{}
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		volume, bytes, ok := strings.Cut(part, "=")
		n, err := strconv.ParseInt(bytes, 10, 64)
		if !ok || volume == "" || err != nil || n <= 0 {
			return nil, fmt.Errorf("disk sizes %q: %q is not <volume>=<bytes>", s, part)
		}
		b[volume] = n
	}
	return b, nil
}

// Covers checks that b gives every disk a size that a COLO secondary can be given: known, and a
// whole number of MiB (KubeVirt rounds an emptyDisk down to one: an overlay of another size
// would not match the disk).
func (b DiskBytes) Covers(disks []string) error {
	for _, d := range disks {
		n, ok := b[d]
		switch {
		case !ok:
			return fmt.Errorf("the size of disk %q is not known", d)
		case n%MiB != 0:
			return fmt.Errorf("%w: disk %q is %d bytes, not a whole number of MiB; KubeVirt makes the COLO secondary's overlays in whole MiB, so they could not match it: resize the disk to a multiple of 1 MiB",
				ErrDiskSizeUnsupported, d, n)
		}
	}
	return nil
}

// ErrDiskSizeUnsupported: a disk's size is one that no COLO secondary can be given.
var ErrDiskSizeUnsupported = errors.New("unsupported disk size")

// PrimaryDiskBytes is the size of each replicated disk of a member that runs the VM: the sizes
// it was built with, else those its lockstepd measured; nil when neither is known yet.
func PrimaryDiskBytes(vmi *virtv1.VirtualMachineInstance) (DiskBytes, error) {
	for _, key := range []string{ftv1.AnnotationDiskBytes, ftv1.AnnotationMeasuredDiskBytes} {
		if s := vmi.Annotations[key]; s != "" {
			b, err := ParseDiskBytes(s)
			if err != nil {
				return nil, fmt.Errorf("member %s, annotation %s: %w", vmi.Name, key, err)
			}
			return b, nil
		}
	}
	return nil, nil
}

// CopyRequest is the storage a copy's claim asks for to hold a disk of n bytes: n and the
// filesystem's overhead, in whole MiB, and never less than the claim it copies.
func CopyRequest(n int64, source resource.Quantity) resource.Quantity {
	need := int64(math.Ceil(float64(n)/(1-FilesystemOverhead)/MiB)) * MiB
	if source.Value() >= need {
		return source.DeepCopy()
	}
	return *resource.NewQuantity(need, resource.BinarySI)
}
