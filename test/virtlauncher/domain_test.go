package virtlauncher

import (
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/lockstep-dev/lockstep/internal/colo"
)

// TestTheDoubleGeneratesKubeVirtsDomain: for the reference VMI, the double's launcher makes the
// reference domain that KubeVirt v1.9 makes (written from its converter's facts), element for
// element; Domain then changes only what forThisMachine lists.
func TestTheDoubleGeneratesKubeVirtsDomain(t *testing.T) {
	t.Run("q35-seabios", func(t *testing.T) { generatesKubeVirtsDomain(t, "q35-seabios.xml", false) })
	t.Run("q35-ovmf", func(t *testing.T) { generatesKubeVirtsDomain(t, "q35-ovmf.xml", true) })
}

func generatesKubeVirtsDomain(t *testing.T, reference string, efi bool) {
	ref := referenceDomain(t, reference)
	spec := DomainSpec{Name: "demo_counter-1", UUID: "6d1a7f0e-2c84-5b43-9a6e-3f2b1c0d9e8a", VMIUID: "0c4e2f1a-7b3d-4e5f-9a1b-2c3d4e5f6a7b",
		VM: colo.VM{MemoryMB: 1024, Tap: "tap0", MAC: "02:6c:73:00:00:01"}, VCPUs: 2, Interface: "vmnet",
		Disks: []Disk{{Name: "rootdisk", Kind: Claim}, {Name: "datadisk", Kind: Claim}, {Name: "cloudinit", Kind: NoCloud},
			{Name: "colo-active", Kind: EmptyDisk}, {Name: "colo-hidden", Kind: EmptyDisk}, {Name: "colo-active-1", Kind: EmptyDisk}, {Name: "colo-hidden-1", Kind: EmptyDisk}}, EFI: efi}
	gen := KubeVirtDomain(spec)
	// KubeVirt's metadata is opaque XML to libvirtxml: compared without its indentation.
	bare := func(d *libvirtxml.Domain) string { return strings.Join(strings.Fields(d.Metadata.XML), "") }
	if bare(gen) != bare(ref) {
		t.Errorf("metadata %s, want %s", gen.Metadata.XML, ref.Metadata.XML)
	}
	gen.Metadata, ref.Metadata = nil, nil
	want, err := ref.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := gen.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("the double's domain differs from KubeVirt's:\n%s\n--- KubeVirt's:\n%s", got, want)
	}
}
