package kubevirtdouble

import "testing"

// TestImageSizesAreKubeVirtsAndCDIs: the sizes the double gives images are those KubeVirt and CDI
// give them, which differ from each other for one claim size: the reason a COLO secondary is
// sized from its primary's disks.
func TestImageSizesAreKubeVirtsAndCDIs(t *testing.T) {
	const gi = 1 << 30
	for _, c := range []struct {
		name      string
		got, want int64
	}{
		{"CDI's import into a 3Gi claim: 3072 MiB less 5.5%", importedSize(3 * gi), 2903 * mib},
		{"CDI's import into a 2Gi claim", importedSize(2 * gi), 1935 * mib},
		{"KubeVirt's disk.img on a blank 2Gi claim", blankSize(2 * gi), 2048 * mib},
		{"KubeVirt's disk.img on a claim of 2168 MiB and 5 bytes", blankSize(2168*mib + 5), 2168 * mib},
		{"KubeVirt's emptyDisk of 2903 MiB and 512 bytes", emptyDiskSize(2903*mib + 512), 2903 * mib},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d bytes, want %d", c.name, c.got, c.want)
		}
	}
}
