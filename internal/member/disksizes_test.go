package member

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

func TestDiskBytesRoundTrip(t *testing.T) {
	b := DiskBytes{"root": 3044 * MiB, "data": 2 << 30}
	if s := b.String(); s != "data=2147483648,root=3191865344" {
		t.Errorf("String: %q", s)
	}
	back, err := ParseDiskBytes(b.String())
	if err != nil || len(back) != 2 || back["root"] != b["root"] || back["data"] != b["data"] {
		t.Errorf("parsed back: %v, %v", back, err)
	}
	for _, bad := range []string{"root", "root=", "=5", "root=-1", "root=0", "root=1Gi"} {
		if _, err := ParseDiskBytes(bad); err == nil || !strings.Contains(err.Error(), "<volume>=<bytes>") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// TestPrimaryDiskBytes: the sizes a member was built with come first (they are what its QEMU
// opened), then what lockstepd measured; none is nil, not an error.
func TestPrimaryDiskBytes(t *testing.T) {
	vmi := func(a map[string]string) *virtv1.VirtualMachineInstance {
		return &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm-1", Annotations: a}}
	}
	for _, c := range []struct {
		annotations map[string]string
		want        int64
		err         string
	}{
		{nil, 0, ""},
		{map[string]string{ftv1.AnnotationMeasuredDiskBytes: "root=1048576"}, MiB, ""},
		{map[string]string{ftv1.AnnotationDiskBytes: "root=2097152", ftv1.AnnotationMeasuredDiskBytes: "root=1048576"}, 2 * MiB, ""},
		{map[string]string{ftv1.AnnotationMeasuredDiskBytes: "root=big"}, 0, "member vm-1, annotation " + ftv1.AnnotationMeasuredDiskBytes},
	} {
		b, err := PrimaryDiskBytes(vmi(c.annotations))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: %v, want %q", c.annotations, err, c.err)
			}
			continue
		}
		if err != nil || b["root"] != c.want || (c.want == 0) != (b == nil) {
			t.Errorf("%v: %v, %v; want root=%d", c.annotations, b, err, c.want)
		}
	}
}

// TestCopyRequest: a copy's claim holds the disk with the filesystem's overhead on top, in whole
// MiB, and never asks for less than the claim it copies.
func TestCopyRequest(t *testing.T) {
	for _, c := range []struct {
		disk   int64
		source string
		want   string
	}{
		{2048 * MiB, "2Gi", "2168Mi"}, // 2048 / 0.945 = 2167.2
		{2903 * MiB, "3Gi", "3072Mi"}, // CDI's 3Gi import: 3072 * 0.945 = 2903.04
		{1024 * MiB, "10Gi", "10Gi"},  // the source is larger
		{MiB, "", "2Mi"},              // 1.06 MiB, rounded up
	} {
		src := resource.Quantity{}
		if c.source != "" {
			src = resource.MustParse(c.source)
		}
		got := CopyRequest(c.disk, src)
		if got.Cmp(resource.MustParse(c.want)) != 0 {
			t.Errorf("disk %d, source %q: %s, want %s", c.disk, c.source, got.String(), c.want)
		}
		if avail := float64(got.Value()) * (1 - FilesystemOverhead); avail < float64(c.disk) {
			t.Errorf("disk %d: a claim of %s leaves %.0f bytes after the filesystem's overhead", c.disk, got.String(), avail)
		}
	}
}
