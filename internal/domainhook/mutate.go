// Package domainhook turns the libvirt domain that KubeVirt's virt-launcher defines for a member
// VMI into a COLO member, as internal/colo's launcher contract asks: lockstepd's monitor in the
// member's directory, each replicated disk as a quorum (with, on a secondary, the replication
// chain over the replica and its active and hidden overlays), the VM's NIC in userspace with one
// queue, and, on a secondary, the packet filters on that NIC and the incoming side of the
// migration. It is pure: XML in, XML out.
//
// libvirt models none of the COLO parts, so they go into <qemu:commandline>. Each replicated
// disk's device stays libvirt's (its address and model are libvirt's, the same on both members);
// libvirt's backend of it is replaced by a read-only /dev/null (a host_device: QEMU's file driver
// takes only regular files), and <qemu:override> points the device at its quorum, so that the
// image is opened once, by the quorum.
//
// KubeVirt calls the hook more than once for one domain (docs/kubevirt.md, "The define
// sequence"): on q35 first with placeholder NICs for hot-plug ports, then on a domain whose
// <devices> are libvirt's read-back of the first call's output and whose every other element is
// KubeVirt's original, so that <qemu:commandline> and <qemu:override> are gone again while the
// disks are already taken over. Mutate therefore takes everything it adds from the Member (the
// images come from the VMI, at KubeVirt's paths), accepts a domain that it already mutated, and
// gives the same member domain whichever of these it is given.
package domainhook

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/lockstep-dev/lockstep/internal/colo"
)

// Member is what the hook knows of the member whose domain it mutates.
type Member struct {
	// Secondary: the member waits for its primary's state; otherwise it runs the VM.
	Secondary bool
	// Sockets is the member's directory as QEMU sees it, shared with the node's lockstepd.
	Sockets colo.Sockets
	// Disks are the disks to replicate, in the VMI's order: every persistent disk of the VM.
	Disks []ReplicatedDisk
	// Emulator, when set, replaces the domain's QEMU binary: lockstep's QEMU, which the member's
	// launcher has from lockstep's QEMU image.
	Emulator string
}

// ReplicatedDisk is a disk to replicate and its overlays: a secondary's active and hidden disks
// (qcow2 images of the disk's size, which KubeVirt makes for emptyDisk volumes), which the hook
// takes out of the guest's devices on every member. Bytes is the disk's size, at which its image
// is opened (the VMI's AnnotationDiskBytes): on every secondary the operator makes, whose claim is
// larger than the primary's disk; 0 on a primary whose disk is its whole image (and on a
// secondary an operator made before the sizes, whose replica is then opened whole, as it was).
type ReplicatedDisk struct {
	Disk, Active, Hidden Disk
	Bytes                int64
}

// Disk is a disk of the VMI as the domain has it.
type Disk struct {
	// Alias is libvirt's alias of the disk (KubeVirt's "ua-<disk name>").
	Alias string
	// Image is the image KubeVirt attaches, in the launcher's filesystem, and Format its format.
	Image, Format string
}

// placeholder is the backend libvirt keeps for the replicated disk's device.
const placeholder = "/dev/null"

// Mutate returns the member's domain. Given its own output, or KubeVirt's read-back of it, it
// returns the same member domain again.
func Mutate(domainXML []byte, m Member) ([]byte, error) {
	if err := m.Sockets.Validate(); err != nil {
		return nil, err
	}
	var d libvirtxml.Domain
	if err := d.Unmarshal(string(domainXML)); err != nil {
		return nil, fmt.Errorf("the domain does not parse: %w", err)
	}
	if d.Devices == nil {
		return nil, errors.New("the domain has no devices")
	}
	if len(m.Disks) == 0 {
		return nil, errors.New("a COLO member replicates at least one disk")
	}
	for _, rd := range m.Disks {
		if err := takeOverDisk(&d, rd.Disk); err != nil {
			return nil, err
		}
		// The overlays are never guest disks: a member that has them (every member does, so
		// that both VMIs have one spec) shows the guest the same devices as one that has not.
		for _, o := range []Disk{rd.Active, rd.Hidden} {
			if err := removeOverlay(&d, o); err != nil {
				return nil, err
			}
		}
	}
	netdev, err := userspaceNIC(&d)
	if err != nil {
		return nil, err
	}
	args := colo.MonitorArgs(m.Sockets)
	if m.Secondary {
		args = append(args, colo.SecondaryNetArgs(m.Sockets, netdev)...)
	}
	for i, rd := range m.Disks {
		image := colo.Image{Path: rd.Disk.Image, Format: rd.Disk.Format, Bytes: rd.Bytes}
		if err := image.Validate(); err != nil {
			return nil, fmt.Errorf("disk %s: %w", rd.Disk.Alias, err)
		}
		if !m.Secondary {
			args = append(args, colo.PrimaryDiskArgs(i, image)...)
			continue
		}
		if rd.Active.Image == "" || rd.Hidden.Image == "" {
			return nil, fmt.Errorf("a secondary needs the active and hidden overlays of disk %s", rd.Disk.Alias)
		}
		args = append(args, colo.SecondaryDiskArgs(i, image, rd.Active.Image, rd.Hidden.Image)...)
	}
	if m.Secondary {
		args = append(args, colo.IncomingArgs(m.Sockets)...)
	}
	if m.Emulator != "" {
		d.Devices.Emulator = m.Emulator
	}
	addArgs(&d, args)
	for i, rd := range m.Disks {
		overrideDisk(&d, rd.Disk.Alias, colo.DiskNode(i))
	}
	out, err := d.Marshal()
	if err != nil {
		return nil, err
	}
	return []byte(out), nil
}

// takeOverDisk leaves libvirt a read-only placeholder backend for the replicated disk's device;
// the quorum opens the image. A device already on the placeholder was taken over by an earlier
// call.
func takeOverDisk(d *libvirtxml.Domain, want Disk) error {
	i, err := findDisk(d, want.Alias)
	if err != nil {
		return err
	}
	disk := &d.Devices.Disks[i]
	if disk.Target == nil || disk.Target.Bus != "virtio" {
		return fmt.Errorf("disk %s: only a virtio disk can be replicated", want.Alias)
	}
	if !takenOver(disk) {
		if err := sameImage(disk, want); err != nil {
			return err
		}
	}
	// libvirt's DAC driver must not give the placeholder to QEMU's user (it would chown the
	// launcher's /dev/null); QEMU opens it read-only, which its mode allows.
	disk.Source = &libvirtxml.DomainDiskSource{Block: &libvirtxml.DomainDiskSourceBlock{Dev: placeholder,
		SecLabel: []libvirtxml.DomainDeviceSecLabel{{Model: "dac", Relabel: "no"}}}}
	disk.Driver = &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "raw"}
	disk.ReadOnly = &libvirtxml.DomainDiskReadOnly{}
	disk.BackingStore = nil
	return nil
}

func takenOver(disk *libvirtxml.DomainDisk) bool {
	return disk.Source != nil && disk.Source.Block != nil && disk.Source.Block.Dev == placeholder && disk.ReadOnly != nil
}

// removeOverlay takes an overlay out of the guest's devices; one that is not there (a primary
// that has none, or a domain whose overlays an earlier call removed) is fine.
func removeOverlay(d *libvirtxml.Domain, want Disk) error {
	if want.Alias == "" {
		return nil
	}
	i, err := findDisk(d, want.Alias)
	if err != nil {
		return nil
	}
	if err := sameImage(&d.Devices.Disks[i], want); err != nil {
		return err
	}
	if want.Format != "qcow2" {
		return fmt.Errorf("disk %s is %s; COLO's overlays must be qcow2", want.Alias, want.Format)
	}
	d.Devices.Disks = slices.Delete(d.Devices.Disks, i, i+1)
	return nil
}

func findDisk(d *libvirtxml.Domain, alias string) (int, error) {
	var seen []string
	for i, disk := range d.Devices.Disks {
		if disk.Alias != nil {
			if disk.Alias.Name == alias {
				return i, nil
			}
			seen = append(seen, disk.Alias.Name)
		}
	}
	return 0, fmt.Errorf("the domain has no disk %q (it has %s)", alias, strings.Join(seen, ", "))
}

// sameImage checks that the domain's disk is the image and format the hook derived from the VMI:
// a launcher that put it elsewhere is not one whose disks the hook knows.
func sameImage(disk *libvirtxml.DomainDisk, want Disk) error {
	if disk.Device != "" && disk.Device != "disk" {
		return fmt.Errorf("disk %s is a %s, not a disk", want.Alias, disk.Device)
	}
	if disk.Source == nil || disk.Source.File == nil || disk.Source.File.File == "" {
		return fmt.Errorf("disk %s is not backed by a file (a filesystem volume)", want.Alias)
	}
	format := "raw"
	if disk.Driver != nil && disk.Driver.Type != "" {
		format = disk.Driver.Type
	}
	if format != "raw" && format != "qcow2" {
		return fmt.Errorf("disk %s is %s; COLO replicates raw and qcow2 images", want.Alias, format)
	}
	if disk.Source.File.File != want.Image || format != want.Format {
		return fmt.Errorf("disk %s is the %s image %s; the hook expects the %s image %s where KubeVirt puts it", want.Alias, format, disk.Source.File.File, want.Format, want.Image)
	}
	return nil
}

// userspaceNIC finds the VM's one NIC and returns QEMU's id of its backend (libvirt names it
// "host" + the NIC's alias, "net<n>" when it has none). The NIC runs in userspace with one queue
// (<driver name="qemu"/>): QEMU's packet filters refuse a vhost or multiqueue backend. KubeVirt's
// placeholder NICs for hot-plug ports (aliases without its "ua-" prefix; the first call of the
// define sequence has them) are not the VM's NIC and are left as they are.
func userspaceNIC(d *libvirtxml.Domain) (string, error) {
	var nics []*libvirtxml.DomainInterface
	for i := range d.Devices.Interfaces {
		if iface := &d.Devices.Interfaces[i]; !hotplugPlaceholder(iface) {
			nics = append(nics, iface)
		}
	}
	if n := len(nics); n != 1 {
		return "", fmt.Errorf("COLO compares the packets of one NIC; the domain has %d", n)
	}
	nic := nics[0]
	if nic.Driver != nil && nic.Driver.Queues > 1 {
		return "", fmt.Errorf("the NIC has %d queues; COLO's packet filters take one (remove networkInterfaceMultiqueue)", nic.Driver.Queues)
	}
	if nic.Driver == nil {
		nic.Driver = &libvirtxml.DomainInterfaceDriver{}
	}
	nic.Driver.Name, nic.Driver.Queues = "qemu", 0
	if nic.Alias == nil || nic.Alias.Name == "" {
		return "hostnet0", nil
	}
	return "host" + nic.Alias.Name, nil
}

// hotplugPlaceholder: KubeVirt's placeholder NICs carry the aliases it generates itself
// ("placeholder-<n>"), not a user's ("ua-<name>").
func hotplugPlaceholder(iface *libvirtxml.DomainInterface) bool {
	return iface.Alias != nil && strings.HasPrefix(iface.Alias.Name, "placeholder-")
}

// addArgs appends args to the domain's <qemu:commandline>, unless an earlier call's are already
// there (a domain that kept them).
func addArgs(d *libvirtxml.Domain, args []string) {
	if d.QEMUCommandline == nil {
		d.QEMUCommandline = &libvirtxml.DomainQEMUCommandline{}
	}
	have := make([]string, len(d.QEMUCommandline.Args))
	for i, a := range d.QEMUCommandline.Args {
		have[i] = a.Value
	}
	if containsRun(have, args) {
		return
	}
	for _, a := range args {
		d.QEMUCommandline.Args = append(d.QEMUCommandline.Args, libvirtxml.DomainQEMUCommandlineArg{Value: a})
	}
}

// containsRun says whether want appears in got, in order and adjacent.
func containsRun(got, want []string) bool {
	for i := 0; i+len(want) <= len(got); i++ {
		if slices.Equal(got[i:i+len(want)], want) {
			return true
		}
	}
	return false
}

// overrideDisk points a replicated disk's device at its quorum node, replacing an earlier call's
// override of it.
func overrideDisk(d *libvirtxml.Domain, alias, node string) {
	if d.QEMUOverride == nil {
		d.QEMUOverride = &libvirtxml.DomainQEMUOverride{}
	}
	d.QEMUOverride.Devices = slices.DeleteFunc(d.QEMUOverride.Devices, func(o libvirtxml.DomainQEMUOverrideDevice) bool { return o.Alias == alias })
	d.QEMUOverride.Devices = append(d.QEMUOverride.Devices, libvirtxml.DomainQEMUOverrideDevice{
		Alias:    alias,
		Frontend: libvirtxml.DomainQEMUOverrideFrontend{Properties: []libvirtxml.DomainQEMUOverrideProperty{{Name: "drive", Type: "string", Value: node}}},
	})
}
