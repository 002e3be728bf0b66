package virtlauncher

import (
	"path/filepath"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/lockstep-dev/lockstep/internal/colo"
)

// DomainSpec is what the domain of a member is made of.
type DomainSpec struct {
	// Name is the domain's name, as KubeVirt names it: <namespace>_<vmi>.
	Name string
	// UUID is the VMI's firmware UUID (the same on both members); VMIUID the VMI's UID, which
	// names the launcher's directory of the VNC and console sockets.
	UUID, VMIUID string
	// VM is the guest: kernel, memory, the NIC's tap and MAC, the console file, and the
	// launcher's own monitor (QMP; none when empty). Its firmware directories are not used: the
	// members' QEMU (lockstep's image) has its firmware beside its binary.
	VM colo.VM
	// VCPUs is the guest's vCPUs (cores of one socket, as a template with cpu.cores has them);
	// 0 is 1.
	VCPUs int
	// Interface is the name of the VMI's one interface (its NIC's alias is ua-<name>); "" is
	// "default".
	Interface string
	// Disks are the VMI's disks, in its order, each with the file of the double's that stands
	// where KubeVirt's launcher has its image.
	Disks []Disk
	// Extra is more QEMU arguments, as qemu:commandline (a test's trace events and packet dumps).
	Extra []string
	// EFI boots the guest with OVMF (a VMI's firmware.bootloader.efi with secureBoot false), not
	// SeaBIOS.
	EFI bool
}

// Disk is a disk of the VMI: its name, what backs it, and the double's file (Launch links it at
// the path KubeVirt's launcher has the image at).
type Disk struct {
	Name string
	Kind DiskKind
	File string
	// Serial is the disk's serial (the VMI disk's serial), which the guest sees
	// (/dev/disk/by-id/virtio-<serial>); "" is none.
	Serial string
}

// DiskKind is what backs a disk, which decides where KubeVirt's launcher has its image and in
// which format.
type DiskKind int

const (
	// Claim: a filesystem claim (a PVC or a DataVolume's), a raw disk.img in the claim's mount.
	Claim DiskKind = iota
	// EmptyDisk: an emptyDisk volume, a qcow2 image the launcher makes.
	EmptyDisk
	// NoCloud: a cloudInitNoCloud volume, the ISO the launcher writes.
	NoCloud
)

// Where KubeVirt's virt-launcher keeps a VMI's files (KubeVirt v1.9): a filesystem claim's image
// (raw, in the claim's mount), an emptyDisk's image (qcow2), the VNC and console sockets and the
// console's log. The double keeps the same paths inside each member's libvirt daemon's mount
// namespace (Launch binds them to the member's files).
const (
	kubevirtPrivate = "/var/run/kubevirt-private"
	// ovmfDir is where virt-launcher's image has OVMF; the NVRAM of a VMI with EFI is made from
	// the VARS template under the launcher's libvirt directory.
	ovmfDir      = "/usr/share/edk2/ovmf"
	nvramDir     = "/var/run/kubevirt-private/libvirt/qemu/nvram"
	emptyDisks   = "/var/run/libvirt/empty-disks"
	cloudInitDir = "/var/run/libvirt/cloud-init-dir"
)

// image is where KubeVirt's launcher has the disk's image, and its format.
func (d Disk) image(s DomainSpec) (string, string) {
	switch d.Kind {
	case EmptyDisk:
		return filepath.Join(emptyDisks, d.Name+".qcow2"), "qcow2"
	case NoCloud:
		ns, name, _ := strings.Cut(s.Name, "_")
		return filepath.Join(cloudInitDir, ns, name, "noCloud.iso"), "raw"
	default:
		return filepath.Join(kubevirtPrivate, "vmi-disks", d.Name, "disk.img"), "raw"
	}
}

func launcherFile(vmiUID, name string) string { return filepath.Join(kubevirtPrivate, vmiUID, name) }

// Domain is the member's domain: the domain KubeVirt v1.9's virt-launcher generates for the
// member's VMI (KubeVirtDomain), changed where this machine cannot run it (forThisMachine).
func Domain(s DomainSpec) *libvirtxml.Domain { return forThisMachine(KubeVirtDomain(s), s) }

// KubeVirtDomain is the domain KubeVirt v1.9's virt-launcher generates for a VMI of s's shape,
// before its define sequence (internal/domainhook/testdata/kubevirt-v1.9 has the reference,
// docs/kubevirt.md the facts): q35 with SeaBIOS; a virtio-non-transitional NIC on the pod's tap
// (ethernet, not managed by libvirt, alias ua-<interface>, the tap's MTU, no ROM); the disks in
// the VMI's order on the virtio bus, vda onwards, by alias ua-<disk> (a claim's raw disk.img, an
// emptyDisk's qcow2 image, the NoCloud ISO), with KubeVirt's driver settings; the guest agent
// channel; USB off, the virtio SCSI and serial controllers; VGA with a VNC socket; memballoon with
// free page reporting; the console on a Unix socket with its log; SMBIOS from the firmware UUID;
// ACPI, no vmport; the host's CPU model with the vCPUs as cores of one socket. With EFI: OVMF's
// code (the secure-boot build, as KubeVirt picks where it exists, with secure boot off), the
// NVRAM made from its VARS template in the launcher's directory, and bochs video.
func KubeVirtDomain(s DomainSpec) *libvirtxml.Domain {
	var disks []libvirtxml.DomainDisk
	for i, d := range s.Disks {
		image, format := d.image(s)
		disks = append(disks, libvirtxml.DomainDisk{Device: "disk", Model: "virtio-non-transitional",
			Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: format, Cache: "none", ErrorPolicy: "stop", Discard: "unmap"},
			Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: image}},
			Target: &libvirtxml.DomainDiskTarget{Dev: "vd" + string(rune('a'+i)), Bus: "virtio"}, Alias: &libvirtxml.DomainAlias{Name: "ua-" + d.Name},
			Serial: d.Serial})
	}
	iface := s.Interface
	if iface == "" {
		iface = "default"
	}
	vcpus := uint(max(s.VCPUs, 1))
	on := "on"
	d := &libvirtxml.Domain{
		Type: "kvm", Name: s.Name,
		Memory: &libvirtxml.DomainMemory{Value: uint(s.VM.MemoryMB) << 20, Unit: "b"},
		OS: &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Arch: "x86_64", Machine: "q35", Type: "hvm"},
			SMBios: &libvirtxml.DomainSMBios{Mode: "sysinfo"}},
		SysInfo: []libvirtxml.DomainSysInfo{{SMBIOS: &libvirtxml.DomainSysInfoSMBIOS{
			System: &libvirtxml.DomainSysInfoSystem{Entry: []libvirtxml.DomainSysInfoEntry{
				{Name: "uuid", Value: s.UUID}, {Name: "manufacturer", Value: "KubeVirt"}, {Name: "family", Value: "KubeVirt"},
				{Name: "product", Value: "None"}, {Name: "sku"}, {Name: "version"}}},
			BIOS: &libvirtxml.DomainSysInfoBIOS{}, BaseBoard: []libvirtxml.DomainSysInfoBaseBoard{{}}, Chassis: &libvirtxml.DomainSysInfoChassis{}}}},
		Devices: &libvirtxml.DomainDeviceList{
			Interfaces: []libvirtxml.DomainInterface{{
				Source: &libvirtxml.DomainInterfaceSource{Ethernet: &libvirtxml.DomainInterfaceSourceEthernet{}},
				Target: &libvirtxml.DomainInterfaceTarget{Dev: s.VM.Tap, Managed: "no"},
				Model:  &libvirtxml.DomainInterfaceModel{Type: "virtio-non-transitional"},
				MAC:    &libvirtxml.DomainInterfaceMAC{Address: s.VM.MAC},
				MTU:    &libvirtxml.DomainInterfaceMTU{Size: 1500},
				Alias:  &libvirtxml.DomainAlias{Name: "ua-" + iface},
				ROM:    &libvirtxml.DomainROM{Enabled: "no"},
			}},
			Channels: []libvirtxml.DomainChannel{{Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{}},
				Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: "org.qemu.guest_agent.0"}}}},
			Controllers: []libvirtxml.DomainController{{Type: "usb", Index: new(uint), Model: "none"},
				{Type: "scsi", Index: new(uint), Model: "virtio-non-transitional"}, {Type: "virtio-serial", Index: new(uint), Model: "virtio-non-transitional"}},
			Videos: []libvirtxml.DomainVideo{{Model: libvirtxml.DomainVideoModel{Type: "vga", Heads: 1, VRam: 16384}}},
			Graphics: []libvirtxml.DomainGraphic{{VNC: &libvirtxml.DomainGraphicVNC{Listeners: []libvirtxml.DomainGraphicListener{
				{Socket: &libvirtxml.DomainGraphicListenerSocket{Socket: launcherFile(s.VMIUID, "virt-vnc")}}}}}},
			MemBalloon: &libvirtxml.DomainMemBalloon{Model: "virtio-non-transitional", FreePageReporting: on, Stats: &libvirtxml.DomainMemBalloonStats{Period: 10}},
			Disks:      disks,
			Serials: []libvirtxml.DomainSerial{{
				Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind", Path: launcherFile(s.VMIUID, "virt-serial0")}},
				Target: &libvirtxml.DomainSerialTarget{Port: new(uint)},
				Log:    &libvirtxml.DomainChardevLog{File: launcherFile(s.VMIUID, "virt-serial0-log"), Append: on}}},
			Consoles: []libvirtxml.DomainConsole{{Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
				Target: &libvirtxml.DomainConsoleTarget{Type: "serial", Port: new(uint)}}},
		},
		Metadata: &libvirtxml.DomainMetadata{XML: `<kubevirt xmlns="http://kubevirt.io"><uid></uid></kubevirt>`},
		Features: &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}, VMPort: &libvirtxml.DomainFeatureState{State: "off"}},
		CPU:      &libvirtxml.DomainCPU{Mode: "host-model", Topology: &libvirtxml.DomainCPUTopology{Sockets: 1, Cores: int(vcpus), Threads: 1}},
		VCPU:     &libvirtxml.DomainVCPU{Placement: "static", Value: vcpus},
	}
	if s.EFI {
		_, vmi, _ := strings.Cut(s.Name, "_")
		d.OS.Loader = &libvirtxml.DomainLoader{Path: filepath.Join(ovmfDir, "OVMF_CODE.secboot.fd"), Readonly: "yes", Secure: "no", Type: "pflash"}
		d.OS.NVRam = &libvirtxml.DomainNVRam{Template: filepath.Join(ovmfDir, "OVMF_VARS.fd"), NVRam: filepath.Join(nvramDir, vmi+"_VARS.fd")}
		d.Devices.Videos[0].Model = libvirtxml.DomainVideoModel{Type: "bochs", Heads: 1}
	}
	return d
}

// forThisMachine is everything the double changes in KubeVirt's domain, because this machine
// cannot run it as it is (docs/kubevirt.md, "What the double's launcher changes", lists the same):
//   - the domain type is qemu: there is no usable KVM here, and QEMU runs under TCG;
//   - the CPU is a named model (qemu64), not host-model, which TCG cannot offer;
//   - TCG's translation cache, which KVM does not have, is capped at tcgCacheMiB, which the
//     launcher's memory cgroup adds to KubeVirt's limit;
//   - the busybox counter guest, which has no boot loader, boots from its kernel and initramfs,
//     with its address on the kernel command line (the Debian guest boots from its disk, as
//     KubeVirt's domain has it, and takes its address from the NoCloud ISO);
//   - with EFI, OVMF's code is OVMF_CODE.fd, not OVMF_CODE.secboot.fd: Debian's secure-boot build
//     requires SMM with a secure flash, which libvirt sets up only for secure="yes", and under
//     TCG it hung before the boot loader; the plain build is the same firmware without SMM;
//   - the double's own QMP monitor, through which the tests read the VM, and the tests' trace
//     and dump arguments are added to <qemu:commandline>.
func forThisMachine(d *libvirtxml.Domain, s DomainSpec) *libvirtxml.Domain {
	d.Type = "qemu"
	if d.OS.Loader != nil {
		d.OS.Loader.Path = filepath.Join(ovmfDir, "OVMF_CODE.fd")
	}
	d.CPU.Mode, d.CPU.Match, d.CPU.Check = "custom", "exact", "none"
	d.CPU.Model = &libvirtxml.DomainCPUModel{Fallback: "forbid", Value: "qemu64"}
	d.Features.TCG = &libvirtxml.DomainFeatureTCG{TBCache: &libvirtxml.DomainFeatureTCGTBCache{Unit: "MiB", Size: tcgCacheMiB}}
	d.OS.Kernel, d.OS.Initrd, d.OS.Cmdline = s.VM.Kernel, s.VM.Initrd, s.VM.Append
	var extra []string
	if s.VM.QMP != "" {
		extra = append(extra, "-qmp", "unix:"+s.VM.QMP+",server=on,wait=off")
	}
	d.QEMUCommandline = &libvirtxml.DomainQEMUCommandline{}
	for _, a := range append(extra, s.Extra...) {
		d.QEMUCommandline.Args = append(d.QEMUCommandline.Args, libvirtxml.DomainQEMUCommandlineArg{Value: a})
	}
	return d
}

// launcherFiles are the member's files at KubeVirt's paths in its launcher, each with the file
// of the double's that stands there (Launch links them in the daemon's mount namespace): the
// disks' images, and the console's log (the test's console file).
func launcherFiles(s DomainSpec) map[string]string {
	files := map[string]string{launcherFile(s.VMIUID, "virt-serial0-log"): s.VM.Serial}
	for _, d := range s.Disks {
		image, _ := d.image(s)
		files[image] = d.File
	}
	return files
}
