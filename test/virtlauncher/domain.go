package virtlauncher

import (
	"libvirt.org/go/libvirtxml"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/colo"
)

// DomainSpec is what the domain of a member is made of.
type DomainSpec struct {
	// Name is the domain's name, as KubeVirt names it: <namespace>_<vmi>.
	Name string
	// UUID is the VMI's firmware UUID (the same on both members).
	UUID string
	// Emulator is the QEMU binary.
	Emulator string
	// VM is the guest: firmware, kernel, memory, the NIC's tap and MAC, the console file, and
	// the launcher's own monitor (QMP; none when empty).
	VM colo.VM
	// ReplicatedDisk is the name of the VMI's replicated disk; Disk its image.
	ReplicatedDisk, Disk string
	// Active and Hidden are the images of the two COLO overlays (emptyDisk volumes of every
	// member VMI).
	Active, Hidden string
	// Extra is more QEMU arguments, as qemu:commandline (a test's trace events and packet dumps).
	Extra []string
}

// Domain is the member's domain as virt-launcher generates it for the member's VMI, in the parts
// the hook reads: the disks by alias (ua-<disk>: the VM's disk and the two COLO overlays), the
// NIC on the pod's tap (ethernet, not managed by libvirt, alias ua-default), and the firmware
// UUID. Where the counter guest needs it, it differs from KubeVirt's: the machine is pc with an
// rtl8139 NIC and the test guest's kernel, under TCG.
func Domain(s DomainSpec) *libvirtxml.Domain {
	fileDisk := func(alias, path, dev string) libvirtxml.DomainDisk {
		return libvirtxml.DomainDisk{Device: "disk",
			Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "qcow2", Cache: "none"},
			Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: path}},
			Target: &libvirtxml.DomainDiskTarget{Dev: dev, Bus: "virtio"}, Alias: &libvirtxml.DomainAlias{Name: alias}}
	}
	args := []libvirtxml.DomainQEMUCommandlineArg{}
	extra := []string{}
	for _, l := range s.VM.Firmware {
		extra = append(extra, "-L", l)
	}
	if s.VM.QMP != "" {
		extra = append(extra, "-qmp", "unix:"+s.VM.QMP+",server=on,wait=off")
	}
	for _, a := range append(extra, s.Extra...) {
		args = append(args, libvirtxml.DomainQEMUCommandlineArg{Value: a})
	}
	return &libvirtxml.Domain{
		Type: "qemu", Name: s.Name, UUID: s.UUID,
		Memory: &libvirtxml.DomainMemory{Value: uint(s.VM.MemoryMB), Unit: "MiB"},
		VCPU:   &libvirtxml.DomainVCPU{Value: 1},
		OS: &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Arch: "x86_64", Machine: "pc", Type: "hvm"},
			Kernel: s.VM.Kernel, Initrd: s.VM.Initrd, Cmdline: s.VM.Append},
		// ACPI, as KubeVirt's domains have it by default (and as QEMU runs without a libvirt: a
		// libvirt that finds no <acpi/> passes -no-acpi, which QEMU 9.2 and later refuse).
		Features:   &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}},
		CPU:        &libvirtxml.DomainCPU{Mode: "custom", Match: "exact", Check: "none", Model: &libvirtxml.DomainCPUModel{Fallback: "forbid", Value: "qemu64"}},
		OnPoweroff: "destroy", OnReboot: "restart", OnCrash: "destroy",
		Devices: &libvirtxml.DomainDeviceList{
			Emulator: s.Emulator,
			Disks: []libvirtxml.DomainDisk{fileDisk("ua-"+s.ReplicatedDisk, s.Disk, "vda"),
				fileDisk("ua-"+ftv1.DiskColoActive, s.Active, "vdb"), fileDisk("ua-"+ftv1.DiskColoHidden, s.Hidden, "vdc")},
			Controllers: []libvirtxml.DomainController{{Type: "usb", Model: "none"}},
			Interfaces: []libvirtxml.DomainInterface{{
				Source: &libvirtxml.DomainInterfaceSource{Ethernet: &libvirtxml.DomainInterfaceSourceEthernet{}},
				Target: &libvirtxml.DomainInterfaceTarget{Dev: s.VM.Tap, Managed: "no"},
				Model:  &libvirtxml.DomainInterfaceModel{Type: "rtl8139"},
				MAC:    &libvirtxml.DomainInterfaceMAC{Address: s.VM.MAC},
				ROM:    &libvirtxml.DomainROM{Enabled: "no"},
				Alias:  &libvirtxml.DomainAlias{Name: "ua-default"},
			}},
			Serials:    []libvirtxml.DomainSerial{{Source: &libvirtxml.DomainChardevSource{File: &libvirtxml.DomainChardevSourceFile{Path: s.VM.Serial}}, Target: &libvirtxml.DomainSerialTarget{Port: new(uint)}}},
			Videos:     []libvirtxml.DomainVideo{{Model: libvirtxml.DomainVideoModel{Type: "none"}}},
			MemBalloon: &libvirtxml.DomainMemBalloon{Model: "none"},
		},
		QEMUCommandline: &libvirtxml.DomainQEMUCommandline{Args: args},
	}
}
