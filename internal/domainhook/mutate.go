// Package domainhook turns the libvirt domain that KubeVirt's virt-launcher defines for a member
// VMI into a COLO member, as internal/colo's launcher contract asks: lockstepd's monitor in the
// member's directory, the replicated disk as a quorum (with, on a secondary, the replication
// chain over the replica and its active and hidden overlays), and, on a secondary, the packet
// filters on the VM's NIC and the incoming side of the migration. It is pure: XML in, XML out.
//
// libvirt models none of this, so it goes into <qemu:commandline>. The guest's disk device stays
// libvirt's (its address and model are libvirt's, the same on both members); libvirt's backend of
// it is replaced by a read-only /dev/null (a host_device: QEMU's file driver takes only regular
// files), and <qemu:override> points the device at the quorum, so that the image is opened once,
// by the quorum.
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
	// Disk is the libvirt alias of the disk to replicate (KubeVirt's "ua-<disk name>").
	Disk string
	// Active and Hidden are the aliases of a secondary's overlay disks (qcow2 images of the
	// replicated disk's size, which KubeVirt makes for emptyDisk volumes); the hook takes them
	// out of the guest's devices.
	Active, Hidden string
	// Emulator, when set, replaces the domain's QEMU binary: a launcher image that carries
	// lockstep's QEMU beside its own (hack/virt-launcher).
	Emulator string
}

// placeholder is the backend libvirt keeps for the replicated disk's device.
const placeholder = "/dev/null"

// Mutate returns the member's domain.
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
	args := colo.MonitorArgs(m.Sockets)
	image, format, err := takeOverDisk(&d, m.Disk)
	if err != nil {
		return nil, err
	}
	// The overlays are never guest disks: a member that has them (every member may, so that
	// both VMIs have one spec) shows the guest the same devices as one that has not.
	active, err := removeDisk(&d, m.Active, "qcow2", m.Secondary)
	if err != nil {
		return nil, err
	}
	hidden, err := removeDisk(&d, m.Hidden, "qcow2", m.Secondary)
	if err != nil {
		return nil, err
	}
	if !m.Secondary {
		args = append(args, colo.PrimaryDiskArgs(image, format)...)
	} else {
		netdev, err := netdevOf(&d)
		if err != nil {
			return nil, err
		}
		args = append(args, colo.SecondaryNetArgs(m.Sockets, netdev)...)
		args = append(args, colo.SecondaryDiskArgs(image, format, active, hidden)...)
		args = append(args, colo.IncomingArgs(m.Sockets)...)
	}
	if m.Emulator != "" {
		d.Devices.Emulator = m.Emulator
	}
	if d.QEMUCommandline == nil {
		d.QEMUCommandline = &libvirtxml.DomainQEMUCommandline{}
	}
	for _, a := range args {
		d.QEMUCommandline.Args = append(d.QEMUCommandline.Args, libvirtxml.DomainQEMUCommandlineArg{Value: a})
	}
	if d.QEMUOverride == nil {
		d.QEMUOverride = &libvirtxml.DomainQEMUOverride{}
	}
	d.QEMUOverride.Devices = append(d.QEMUOverride.Devices, libvirtxml.DomainQEMUOverrideDevice{
		Alias:    m.Disk,
		Frontend: libvirtxml.DomainQEMUOverrideFrontend{Properties: []libvirtxml.DomainQEMUOverrideProperty{{Name: "drive", Type: "string", Value: colo.DiskID}}},
	})
	out, err := d.Marshal()
	if err != nil {
		return nil, err
	}
	return []byte(out), nil
}

// takeOverDisk finds the disk to replicate, returns its image and format, and leaves libvirt a
// read-only placeholder backend for its device.
func takeOverDisk(d *libvirtxml.Domain, alias string) (image, format string, err error) {
	i, err := findDisk(d, alias)
	if err != nil {
		return "", "", err
	}
	disk := &d.Devices.Disks[i]
	image, format, err = fileOf(disk)
	if err != nil {
		return "", "", err
	}
	if disk.Target == nil || disk.Target.Bus != "virtio" {
		return "", "", fmt.Errorf("disk %s: only a virtio disk can be replicated", alias)
	}
	disk.Source = &libvirtxml.DomainDiskSource{Block: &libvirtxml.DomainDiskSourceBlock{Dev: placeholder}}
	disk.Driver = &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "raw"}
	disk.ReadOnly = &libvirtxml.DomainDiskReadOnly{}
	disk.BackingStore = nil
	return image, format, nil
}

// removeDisk takes a disk out of the guest's devices and returns its image, which must be in
// format; a disk that is not required may be missing.
func removeDisk(d *libvirtxml.Domain, alias, format string, required bool) (string, error) {
	i, err := findDisk(d, alias)
	if err != nil {
		if !required {
			return "", nil
		}
		return "", err
	}
	image, got, err := fileOf(&d.Devices.Disks[i])
	if err != nil {
		return "", err
	}
	if got != format {
		return "", fmt.Errorf("disk %s is %s; COLO's overlays must be %s", alias, got, format)
	}
	d.Devices.Disks = slices.Delete(d.Devices.Disks, i, i+1)
	return image, nil
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

// fileOf is a disk's image file and format.
func fileOf(disk *libvirtxml.DomainDisk) (image, format string, err error) {
	name := "?"
	if disk.Alias != nil {
		name = disk.Alias.Name
	}
	if disk.Device != "" && disk.Device != "disk" {
		return "", "", fmt.Errorf("disk %s is a %s, not a disk", name, disk.Device)
	}
	if disk.Source == nil || disk.Source.File == nil || disk.Source.File.File == "" {
		return "", "", fmt.Errorf("disk %s is not backed by a file (a filesystem volume)", name)
	}
	format = "raw"
	if disk.Driver != nil && disk.Driver.Type != "" {
		format = disk.Driver.Type
	}
	if format != "raw" && format != "qcow2" {
		return "", "", fmt.Errorf("disk %s is %s; COLO replicates raw and qcow2 images", name, format)
	}
	return disk.Source.File.File, format, nil
}

// netdevOf is QEMU's id of the backend of the VM's one NIC: libvirt names it "host" + the NIC's
// alias ("net<n>" when it has none).
func netdevOf(d *libvirtxml.Domain) (string, error) {
	if n := len(d.Devices.Interfaces); n != 1 {
		return "", fmt.Errorf("COLO compares the packets of one NIC; the domain has %d", n)
	}
	iface := d.Devices.Interfaces[0]
	if iface.Alias == nil || iface.Alias.Name == "" {
		return "hostnet0", nil
	}
	return "host" + iface.Alias.Name, nil
}
