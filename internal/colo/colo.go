// Package colo drives QEMU's COLO (COarse-grained LOck-stepping) for one pair: the command lines
// of the primary and the secondary QEMU, and the QMP sequences that start COLO, make the
// secondary go live when the primary is lost, and let the primary go on alone when the secondary
// is lost. QEMU's COLO has no failure detection of its own: lockstepd decides when these run.
// The sequences follow QEMU's docs/COLO-FT.txt; the option sets were tried on QEMU 7.2 under TCG
// (DESIGN.md, COLO-NOTES.md).
package colo

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/lockstep-dev/lockstep/internal/qmp"
)

// Ports are the TCP ports of the COLO streams on the logging network.
type Ports struct {
	// Mirror carries the primary's packets to the secondary (filter-mirror → redirector).
	Mirror int
	// Compare carries the secondary's packets back to the primary's colo-compare.
	Compare int
	// Migration carries the checkpoints (memory and device state).
	Migration int
	// NBD carries the primary's disk writes to the secondary's replication driver.
	NBD int
}

// DefaultPorts are the ports of QEMU's documentation.
var DefaultPorts = Ports{Mirror: 9003, Compare: 9004, Migration: 9998, NBD: 9999}

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
	// QMP is the path of the QMP socket; Serial the file the console goes to.
	QMP, Serial string
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
	return append(args,
		"-serial", "file:"+vm.Serial, "-qmp", "unix:"+vm.QMP+",server=on,wait=off",
		"-netdev", "tap,id=hn0,ifname="+vm.Tap+",script=no,downscript=no,vhost=off",
		"-device", "rtl8139,id=e0,netdev=hn0,mac="+vm.MAC+",romfile=")
}

// PrimaryArgs is the primary QEMU's command line (without the binary). It opens, on listen (its
// logging-network address), the sockets the secondary's packet streams use, and colo-compare's
// local loops; the filters that divert the VM's traffic through them are added by StartPrimary,
// so that the VM runs unprotected, with its network untouched, until it enters COLO. It starts
// paused (-S): continue it (QMP "cont") to run it before protecting it.
func PrimaryArgs(vm VM, disk, listen string, p Ports) []string {
	sock := func(id, host string, port int, server bool) string {
		s := fmt.Sprintf("socket,id=%s,host=%s,port=%d", id, host, port)
		if server {
			s += ",server=on,wait=off"
		}
		return s
	}
	// Local loops of colo-compare, on loopback ports derived from the compare port.
	cmpIn, cmpOut := p.Compare+1000, p.Compare+1001
	return append(vm.Args("primary"),
		"-chardev", sock("mirror0", listen, p.Mirror, true),
		"-chardev", sock("compare1", listen, p.Compare, true),
		"-chardev", sock("compare0", "127.0.0.1", cmpIn, true),
		"-chardev", sock("compare0-0", "127.0.0.1", cmpIn, false),
		"-chardev", sock("compare_out", "127.0.0.1", cmpOut, true),
		"-chardev", sock("compare_out0", "127.0.0.1", cmpOut, false),
		"-drive", "if=virtio,id=colo-disk0,driver=quorum,read-pattern=fifo,vote-threshold=1,children.0.file.filename="+disk+",children.0.driver=qcow2",
		"-S")
}

// SecondaryArgs is the secondary QEMU's command line. parent is its copy of the primary's disk;
// active and hidden are empty qcow2 images of the same size (best on tmpfs): COLO writes the
// secondary's own writes and the primary's replicated ones there until a failover merges them.
func SecondaryArgs(vm VM, parent, active, hidden, primary, listen string, p Ports) []string {
	return append(vm.Args("secondary"),
		"-chardev", fmt.Sprintf("socket,id=red0,host=%s,port=%d,reconnect=1", primary, p.Mirror),
		"-chardev", fmt.Sprintf("socket,id=red1,host=%s,port=%d,reconnect=1", primary, p.Compare),
		"-object", "filter-redirector,id=f1,netdev=hn0,queue=tx,indev=red0",
		"-object", "filter-redirector,id=f2,netdev=hn0,queue=rx,outdev=red1",
		"-object", "filter-rewriter,id=rew0,netdev=hn0,queue=all",
		"-drive", "if=none,id=parent0,file.filename="+parent+",driver=qcow2",
		"-drive", "if=none,id=childs0,driver=replication,mode=secondary,file.driver=qcow2,top-id=colo-disk0,"+
			"file.file.filename="+active+",file.backing.driver=qcow2,file.backing.file.filename="+hidden+",file.backing.backing=parent0",
		"-drive", "if=virtio,id=colo-disk0,driver=quorum,read-pattern=fifo,vote-threshold=1,children.0=childs0",
		"-incoming", "tcp:"+net.JoinHostPort(listen, strconv.Itoa(p.Migration)))
}

func colo(ctx context.Context, q *qmp.Conn) error {
	return q.Execute(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-colo", "state": true}}}, nil)
}

// StartSecondary readies the secondary: COLO on, and its NBD server for the primary's disk writes.
func StartSecondary(ctx context.Context, q *qmp.Conn, listen string, p Ports) error {
	if err := colo(ctx, q); err != nil {
		return err
	}
	if err := q.Execute(ctx, "nbd-server-start", map[string]any{"addr": map[string]any{
		"type": "inet", "data": map[string]any{"host": listen, "port": strconv.Itoa(p.NBD)}}}, nil); err != nil {
		return err
	}
	return q.Execute(ctx, "nbd-server-add", map[string]any{"device": "parent0", "writable": true}, nil)
}

// StartPrimary diverts the VM's traffic through colo-compare, replicates the disk to the
// secondary, and migrates into COLO with a checkpoint at least every checkpoint (colo-compare
// forces one sooner when the two sides' packets differ). The secondary must be started first
// (StartSecondary), with its packet streams connected to the primary's sockets.
func StartPrimary(ctx context.Context, q *qmp.Conn, secondary string, p Ports, checkpoint time.Duration) error {
	if err := run(ctx, q, "primary's COLO filters", false, []step{
		{"object-add", map[string]any{"qom-type": "filter-mirror", "id": "m0", "netdev": "hn0", "queue": "tx", "outdev": "mirror0"}},
		{"object-add", map[string]any{"qom-type": "filter-redirector", "id": "redire0", "netdev": "hn0", "queue": "rx", "indev": "compare_out"}},
		{"object-add", map[string]any{"qom-type": "filter-redirector", "id": "redire1", "netdev": "hn0", "queue": "rx", "outdev": "compare0"}},
		{"object-add", map[string]any{"qom-type": "iothread", "id": "iothread1"}},
		{"object-add", map[string]any{"qom-type": "colo-compare", "id": "comp0", "primary_in": "compare0-0", "secondary_in": "compare1", "outdev": "compare_out0", "iothread": "iothread1"}},
	}); err != nil {
		return err
	}
	if _, err := q.HMP(ctx, fmt.Sprintf("drive_add -n buddy driver=replication,mode=primary,file.driver=nbd,file.host=%s,file.port=%d,file.export=parent0,node-name=replication0", secondary, p.NBD)); err != nil {
		return err
	}
	if err := q.Execute(ctx, "x-blockdev-change", map[string]any{"parent": "colo-disk0", "node": "replication0"}, nil); err != nil {
		return err
	}
	if err := colo(ctx, q); err != nil {
		return err
	}
	if err := q.Execute(ctx, "migrate-set-parameters", map[string]any{"x-checkpoint-delay": checkpoint.Milliseconds()}, nil); err != nil {
		return err
	}
	return q.Execute(ctx, "migrate", map[string]any{"uri": "tcp:" + net.JoinHostPort(secondary, strconv.Itoa(p.Migration))}, nil)
}

// Status is query-colo-status.
type Status struct {
	Mode     string `json:"mode"`
	LastMode string `json:"last-mode"`
	Reason   string `json:"reason"`
}

// WaitMode waits until the side is in COLO mode want ("primary" or "secondary").
func WaitMode(ctx context.Context, q *qmp.Conn, want string) error {
	for {
		var st Status
		if err := q.Execute(ctx, "query-colo-status", nil, &st); err != nil {
			return err
		}
		if st.Mode == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("COLO mode %q, want %q: %w", st.Mode, want, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// step is one QMP command of a sequence.
type step struct {
	cmd  string
	args any
}

// run executes a sequence in order; a step whose object is already gone counts as done when
// tolerateGone is set (a side may have torn part of it down itself).
func run(ctx context.Context, q *qmp.Conn, what string, tolerateGone bool, steps []step) error {
	for _, s := range steps {
		err := q.Execute(ctx, s.cmd, s.args, nil)
		gone := err != nil && strings.Contains(err.Error(), "not found")
		if err != nil && (!tolerateGone || !gone) {
			return fmt.Errorf("%s, %s: %w", what, s.cmd, err)
		}
	}
	return nil
}

// SecondaryGoLive makes the secondary the VM after its primary was lost: stop taking the
// primary's disk writes, leave COLO (QEMU merges the active and hidden disks and resumes the
// guest), and stop listening for the primary's packet streams. Its network must then be
// attached by the caller.
func SecondaryGoLive(ctx context.Context, q *qmp.Conn) error {
	return run(ctx, q, "secondary go-live", false, []step{
		{"nbd-server-stop", nil},
		{"x-colo-lost-heartbeat", nil},
		{"object-del", map[string]any{"id": "f2"}},
		{"object-del", map[string]any{"id": "f1"}},
		{"chardev-remove", map[string]any{"id": "red1"}},
		{"chardev-remove", map[string]any{"id": "red0"}},
	})
}

// PrimaryGoAlone lets the primary run on without its lost secondary: leave COLO and stop
// comparing and mirroring packets.
func PrimaryGoAlone(ctx context.Context, q *qmp.Conn) error {
	return run(ctx, q, "primary go-alone", true, []step{
		{"x-colo-lost-heartbeat", nil},
		{"object-del", map[string]any{"id": "m0"}},
		{"object-del", map[string]any{"id": "redire0"}},
		{"object-del", map[string]any{"id": "redire1"}},
		{"object-del", map[string]any{"id": "comp0"}},
		{"x-blockdev-change", map[string]any{"parent": "colo-disk0", "child": "children.1"}},
		{"human-monitor-command", map[string]any{"command-line": "drive_del replication0"}},
	})
}
