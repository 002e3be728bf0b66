package colo

import (
	"fmt"
	"strconv"
)

// This file is the launcher's side of the contract: the command lines of a member's QEMU. lockstep
// never runs them itself; whatever launches the member's QEMU (KubeVirt's virt-launcher through
// the domain hook, or the VM tier's test launcher) gives QEMU these options, a second QMP monitor
// at Sockets.QMP for lockstepd, and the member's socket directory, and the engine attaches to it.

// VM is what both sides share: the same guest, the same MAC.
type VM struct {
	QEMU     string
	Firmware []string // -L directories
	Kernel   string
	Initrd   string
	Append   string
	MemoryMB int
	// Tap is the host interface of the VM's NIC; MAC is the NIC's address (the same on both
	// sides, so that the secondary takes over the primary's identity on the network).
	Tap, MAC string
	// QMP is the path of the launcher's own QMP socket; Serial the file the console goes to.
	QMP, Serial string
	// Sockets is the member's directory, shared with the node's lockstepd: lockstepd's QMP
	// monitor and the COLO streams.
	Sockets Sockets
}

// Args is the command line every QEMU of lockstep's runs with, COLO or not: TCG, the guest, the
// console, QMP, and the NIC on the tap: virtio, as KubeVirt's, on a tap that carries the
// virtio-net header (as libvirt opens it for a virtio NIC), with vhost off (COLO's filters refuse
// it; the KubeVirt hook turns it off).
func (vm VM) Args(name string) []string {
	args := []string{"-name", name, "-accel", "tcg", "-cpu", "qemu64", "-m", strconv.Itoa(max(vm.MemoryMB, 128)), "-smp", "1",
		"-nodefaults", "-display", "none", "-vga", "none"}
	for _, l := range vm.Firmware {
		args = append(args, "-L", l)
	}
	if vm.Kernel != "" {
		args = append(args, "-kernel", vm.Kernel, "-initrd", vm.Initrd, "-append", vm.Append)
	}
	if vm.Sockets.Dir != "" {
		args = append(args, MonitorArgs(vm.Sockets)...)
	}
	return append(args,
		"-serial", "file:"+vm.Serial, "-qmp", "unix:"+vm.QMP+",server=on,wait=off",
		"-netdev", "tap,id="+netdev+",ifname="+vm.Tap+",script=no,downscript=no,vhost=off,vnet_hdr=on",
		"-device", "virtio-net-pci-non-transitional,id=e0,netdev="+netdev+",mac="+vm.MAC+",romfile=")
}

// netdev is the id of the test launcher's NIC backend.
const netdev = "hn0"

// DiskNode is the id of the member's i-th replicated disk: a quorum that the launcher attaches the
// guest's disk device to (drive=colo-disk<i>), and to which protection adds the replication
// child. Every persistent disk of the VM is one, in the VMI's order; the engine finds how many
// there are in QEMU (ReplicatedDisks).
func DiskNode(i int) string { return "colo-disk" + strconv.Itoa(i) }

// parentNode is the secondary's replica of the primary's i-th disk, which its NBD server exports
// (under the same name) for the resync and for the primary's replicated writes.
func parentNode(i int) string { return "parent" + strconv.Itoa(i) }

// PrimaryArgs is the primary QEMU's command line (without the binary): the VM with its disks (raw
// images, as KubeVirt's disk.img of a filesystem claim), each the only child of a quorum to which
// protection adds the replication child. The VM runs from the start, as a launcher starts it: the
// operator gave the pair's record to this member before it made it.
func PrimaryArgs(vm VM, disks []string) []string {
	args := vm.Args("primary")
	for i, d := range disks {
		args = append(append(args, PrimaryDiskArgs(i, Image{Path: d, Format: "raw"})...), "-device", "virtio-blk-pci,drive="+DiskNode(i))
	}
	return args
}

// SecondaryDisk is a secondary's replication chain of one disk: its replica of the primary's disk
// (raw; protection resyncs it), and the active and hidden qcow2 overlays of the same size (best on
// tmpfs), where COLO writes the secondary's own writes and the primary's replicated ones until a
// failover merges them. Bytes, when set, is the primary's disk's size, at which the replica is
// opened (it may be larger).
type SecondaryDisk struct {
	Parent, Active, Hidden string
	Bytes                  int64
}

// SecondaryArgs is the secondary QEMU's command line. Its packet streams dial the node's
// lockstepd, which carries them to the primary; it takes the migration on its own socket.
func SecondaryArgs(vm VM, disks []SecondaryDisk) []string {
	args := append(vm.Args("secondary"), SecondaryNetArgs(vm.Sockets, netdev)...)
	for i, d := range disks {
		args = append(append(args, SecondaryDiskArgs(i, Image{Path: d.Parent, Format: "raw", Bytes: d.Bytes}, d.Active, d.Hidden)...), "-device", "virtio-blk-pci,drive="+DiskNode(i))
	}
	return append(args, IncomingArgs(vm.Sockets)...)
}

// The pieces of a member's command line that every launcher adds the same way (the test
// launcher above; KubeVirt's through the domain hook, internal/domainhook).

// MonitorArgs is lockstepd's own QMP monitor of the member's QEMU, in the member's directory.
func MonitorArgs(s Sockets) []string {
	return []string{"-qmp", "unix:" + s.QMP() + ",server=on,wait=off"}
}

// Image is a replicated disk's image as a launcher attaches it.
type Image struct {
	Path, Format string
	// Bytes, when set, is the disk's size: the image is opened at exactly that size (raw images
	// only; the image may be larger, never smaller). QEMU pairs only disks of one size, and a
	// secondary's image is its claim's, which is often larger than the primary's disk.
	Bytes int64
}

// Validate checks that QEMU can open the image at its size.
func (im Image) Validate() error {
	if im.Bytes > 0 && im.Format != "raw" {
		return fmt.Errorf("the %s image %s cannot be opened at a set size (raw images only)", im.Format, im.Path)
	}
	return nil
}

// options are the image's format node's options, under prefix.
func (im Image) options(prefix string) string {
	o := prefix + "driver=" + im.Format + "," + prefix + "file.filename=" + im.Path
	if im.Bytes > 0 {
		o += "," + prefix + "size=" + strconv.FormatInt(im.Bytes, 10)
	}
	return o
}

// PrimaryDiskArgs is the primary's i-th disk as the only child of the quorum DiskNode(i), with
// no device: the launcher attaches the guest's disk device to it.
func PrimaryDiskArgs(i int, disk Image) []string {
	return []string{"-drive", "if=none,id=" + DiskNode(i) + ",driver=quorum,read-pattern=fifo,vote-threshold=1," + disk.options("children.0.")}
}

// SecondaryDiskArgs is the secondary's replication chain of its i-th disk, with no device: its
// replica of the primary's disk (parent, an NBD export for the resync), the active and hidden
// qcow2 overlays of the same size, and the quorum DiskNode(i) over them.
//
// The overlays skip flushes (cache.no-flush): they are scratch that QEMU empties at every
// checkpoint, and emptying a qcow2 image syncs its header and tables several times, which made
// about half of the secondary's part of each checkpoint's pause (docs/colo.md). Nothing needs
// them durable: they live and die with the member's pod (KubeVirt emptyDisks; a member whose
// node fails is replaced, never restarted from them), and on failover QEMU commits them into
// the replica, which keeps its flushes.
//
// The replica unmaps what is written as zeros (discard=unmap, detect-zeroes=unmap): the resync
// writes every zero range of the primary's disk into it, which would otherwise allocate the whole
// of a sparse claim on the secondary's storage.
func SecondaryDiskArgs(i int, parent Image, active, hidden string) []string {
	n := strconv.Itoa(i)
	return []string{
		"-drive", "if=none,id=" + parentNode(i) + "," + parent.options("") + ",discard=unmap,detect-zeroes=unmap",
		"-drive", "if=none,id=childs" + n + ",driver=replication,mode=secondary,cache.no-flush=on,file.driver=qcow2,top-id=" + DiskNode(i) + "," +
			"file.file.filename=" + active + ",file.backing.driver=qcow2,file.backing.file.filename=" + hidden + ",file.backing.backing=" + parentNode(i),
		"-drive", "if=none,id=" + DiskNode(i) + ",driver=quorum,read-pattern=fifo,vote-threshold=1,children.0=childs" + n,
	}
}

// SecondaryNetArgs are the secondary's packet filters on its NIC's backend (netdev): the
// primary's mirrored packets come in and its own go out to the primary's comparison, through the
// member's stream sockets, which lockstepd relays; the rewriter keeps TCP sequence numbers in
// step after a failover. Each carries the virtio-net header's length, as the primary's do
// (StartPrimary).
func SecondaryNetArgs(s Sockets, netdev string) []string {
	return []string{
		"-chardev", "socket,id=red0,path=" + s.Path(StreamMirror) + ",reconnect-ms=1000",
		"-chardev", "socket,id=red1,path=" + s.Path(StreamCompare) + ",reconnect-ms=1000",
		"-object", "filter-redirector,id=f1,netdev=" + netdev + ",queue=tx,indev=red0,vnet_hdr_support=on",
		"-object", "filter-redirector,id=f2,netdev=" + netdev + ",queue=rx,outdev=red1,vnet_hdr_support=on",
		"-object", "filter-rewriter,id=rew0,netdev=" + netdev + ",queue=all,vnet_hdr_support=on",
	}
}

// IncomingArgs makes the secondary wait for the primary's state on its migration socket.
func IncomingArgs(s Sockets) []string {
	return []string{"-incoming", "unix:" + s.Path(StreamMigration)}
}
