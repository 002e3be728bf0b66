package virtlauncher

import (
	"os"
	"testing"

	"libvirt.org/go/libvirtxml"
)

// TestKubeVirtsHotplugPortsForTheReferenceMember: the reference member (one NIC, seven virtio
// disks, three controllers, the balloon) takes 12 PCI slots by KubeVirt's count, so KubeVirt adds
// three placeholder NICs and, up to 2 GiB of guest memory, no root port: the hook is called
// twice. Above 2 GiB KubeVirt wants six free ports: three root ports more, and a third call.
func TestKubeVirtsHotplugPortsForTheReferenceMember(t *testing.T) {
	for _, ref := range []string{"q35-seabios.xml", "q35-ovmf.xml"} {
		d := referenceDomain(t, ref)
		if got := PCIDevices(d); got != 12 {
			t.Errorf("%s: %d PCI devices, want 12", ref, got)
		}
		if p, e, c := Placeholders(d), ExtraRootPorts(d), Calls(d); p != 3 || e != 0 || c != 2 {
			t.Errorf("%s at 1 GiB: %d placeholders, %d root ports, %d calls; want 3, 0, 2", ref, p, e, c)
		}
		d.Memory = &libvirtxml.DomainMemory{Value: 3 << 30, Unit: "b"}
		if p, e, c := Placeholders(d), ExtraRootPorts(d), Calls(d); p != 3 || e != 3 || c != 3 {
			t.Errorf("%s at 3 GiB: %d placeholders, %d root ports, %d calls; want 3, 3, 3", ref, p, e, c)
		}
		d.Memory = &libvirtxml.DomainMemory{Value: 2, Unit: "GiB"} // exactly 2 GiB is not above it
		if e := ExtraRootPorts(d); e != 0 {
			t.Errorf("%s at 2 GiB: %d root ports, want 0", ref, e)
		}
		d.OS.Type.Machine = "pc-i440fx-9.2"
		if p, e, c := Placeholders(d), ExtraRootPorts(d), Calls(d); p != 0 || e != 0 || c != 1 {
			t.Errorf("%s on pc: %d placeholders, %d root ports, %d calls; want one call", ref, p, e, c)
		}
	}
}

// TestKubeVirtAppendsRootPortsAboveThePCIControllers: the root ports KubeVirt appends take the
// indexes above the highest PCI controller's (libvirt's, after the read-back), up to bus index 31.
func TestKubeVirtAppendsRootPortsAboveThePCIControllers(t *testing.T) {
	d := referenceDomain(t, "q35-seabios.xml")
	for _, i := range []uint{0, 1, 7, 3} {
		d.Devices.Controllers = append(d.Devices.Controllers, libvirtxml.DomainController{Type: "pci", Index: &i, Model: "pcie-root-port"})
	}
	ports := func(d *libvirtxml.Domain) (idx []uint) {
		for _, c := range d.Devices.Controllers {
			if c.Model == "pcie-root-port" {
				idx = append(idx, *c.Index)
			}
		}
		return idx
	}
	got := ports(WithRootPorts(d, 3))
	if want := []uint{0, 1, 7, 3, 8, 9, 10}; len(got) != len(want) || got[4] != 8 || got[6] != 10 {
		t.Errorf("root ports %v, want %v", got, want)
	}
	if got := ports(WithRootPorts(d, 40)); got[len(got)-1] != 31 || len(got) != 4+24 {
		t.Errorf("40 more root ports: %v, want them to stop at index 31", got)
	}
	if n := len(ports(d)); n != 4 {
		t.Errorf("WithRootPorts changed its argument: %d root ports", n)
	}
}

func referenceDomain(t *testing.T, file string) *libvirtxml.Domain {
	t.Helper()
	raw, err := os.ReadFile("../../internal/domainhook/testdata/kubevirt-v1.9/" + file)
	if err != nil {
		t.Fatal(err)
	}
	var d libvirtxml.Domain
	if err := d.Unmarshal(string(raw)); err != nil {
		t.Fatal(err)
	}
	return &d
}
