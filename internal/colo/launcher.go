package colo

import (
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
// console, QMP, and the NIC on the tap.
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
		args = append(args, "-qmp", "unix:"+vm.Sockets.QMP()+",server=on,wait=off")
	}
	return append(args,
		"-serial", "file:"+vm.Serial, "-qmp", "unix:"+vm.QMP+",server=on,wait=off",
		"-netdev", "tap,id=hn0,ifname="+vm.Tap+",script=no,downscript=no,vhost=off",
		"-device", "rtl8139,id=e0,netdev=hn0,mac="+vm.MAC+",romfile=")
}

// PrimaryArgs is the primary QEMU's command line (without the binary): the VM with its disk as
// the only child of a quorum, to which protection adds the replication child. The VM runs from
// the start, as a launcher starts it: the operator gave the pair's record to this member before
// it made it.
func PrimaryArgs(vm VM, disk string) []string {
	return append(vm.Args("primary"),
		"-drive", "if=virtio,id=colo-disk0,driver=quorum,read-pattern=fifo,vote-threshold=1,children.0.file.filename="+disk+",children.0.driver=qcow2")
}

// SecondaryArgs is the secondary QEMU's command line. parent is its replica of the primary's disk
// (Protect resyncs it); active and hidden are empty qcow2 images of the same size (best on
// tmpfs): COLO writes the secondary's own writes and the primary's replicated ones there until a
// failover merges them. Its packet streams dial the node's lockstepd, which carries them to the
// primary; it takes the migration on its own socket.
func SecondaryArgs(vm VM, parent, active, hidden string) []string {
	s := vm.Sockets
	return append(vm.Args("secondary"),
		"-chardev", "socket,id=red0,path="+s.Path(StreamMirror)+",reconnect=1",
		"-chardev", "socket,id=red1,path="+s.Path(StreamCompare)+",reconnect=1",
		"-object", "filter-redirector,id=f1,netdev=hn0,queue=tx,indev=red0",
		"-object", "filter-redirector,id=f2,netdev=hn0,queue=rx,outdev=red1",
		"-object", "filter-rewriter,id=rew0,netdev=hn0,queue=all",
		"-drive", "if=none,id=parent0,file.filename="+parent+",driver=qcow2",
		"-drive", "if=none,id=childs0,driver=replication,mode=secondary,file.driver=qcow2,top-id=colo-disk0,"+
			"file.file.filename="+active+",file.backing.driver=qcow2,file.backing.file.filename="+hidden+",file.backing.backing=parent0",
		"-drive", "if=virtio,id=colo-disk0,driver=quorum,read-pattern=fifo,vote-threshold=1,children.0=childs0",
		"-incoming", "unix:"+s.Path(StreamMigration))
}
