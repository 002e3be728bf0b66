//go:build linux && vmtier

// Package vmtier runs real QEMU (hack/qemu.sh) with lockstep's counter guest (hack/guest.sh)
// inside network namespaces the test makes: one guest serving its counter (guest_test.go), and
// COLO pairs (colo_test.go, restart_test.go, harness_test.go). The test launches each member's
// QEMU as a launcher would (the member's directory, lockstepd's monitor), and lockstepd's
// production wiring attaches to it: lockstepd.Node with the COLO engine factory of cmd/lockstepd,
// in the test process, one per node namespace, with an in-memory test double of the pair's Lease;
// and in daemon_test.go the lockstepd binary itself, one process per node, against a real
// kube-apiserver (docs/colo.md).
package vmtier

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/colo"
	"github.com/lockstep-dev/lockstep/internal/qmp"
	"github.com/lockstep-dev/lockstep/internal/testnet"
	"github.com/lockstep-dev/lockstep/test/counter"
)

var root = filepath.Join("..", "..")

// build runs a hack script, with env added to the test's environment, and returns the directory
// it printed.
func build(t testing.TB, script string, env ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(root, "hack", script))
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("hack/%s: %v\n%s", script, err, stderr)
	}
	return string(regexp.MustCompile(`\s+$`).ReplaceAll(out, nil))
}

// guestMAC is the MAC address of the VM's NIC, whichever guest it runs.
const guestMAC = "52:54:00:12:34:56"

// guestVM is the counter guest with address addr/24, its QMP socket and console in dir.
func guestVM(qemu, guest, dir, name, addr string) colo.VM {
	return colo.VM{
		Firmware: []string{filepath.Join(qemu, "firmware", "qemu"), filepath.Join(qemu, "firmware", "seabios")},
		Kernel:   filepath.Join(guest, "vmlinuz"), Initrd: filepath.Join(guest, "initramfs.cpio.gz"),
		Append: "console=ttyS0 panic=-1 quiet lockstep.ip=" + addr + "/24", MemoryMB: 256,
		Tap: "tap0", MAC: guestMAC,
		QMP: filepath.Join(dir, name+".qmp"), Serial: filepath.Join(dir, name+".console"),
	}
}

// ask sends one request to the guest's counter from the client namespace (test/counter, the
// client every tier uses).
func ask(ns, addr string) (count int, bootID string, disk int, err error) {
	r, err := counter.Ask(context.Background(), ns, addr)
	return r.Count, r.BootID, r.Disk, err
}

func ip(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %v: %v\n%s", args, err, out)
	}
}

// TestGuestServesACounter boots the guest on a tap bridged to a client namespace and checks
// that the counter counts, the boot id stays, and the disk follows.
func TestGuestServesACounter(t *testing.T) {
	qemu, guest := build(t, "qemu.sh"), build(t, "guest.sh")
	link := testnet.NewLink(t) // A: the client, B: the node
	ip(t, "-n", link.B, "link", "add", "br0", "type", "bridge")
	ip(t, "-n", link.B, "link", "set", link.BIf, "master", "br0")
	ip(t, "-n", link.B, "addr", "flush", "dev", link.BIf)
	ip(t, "-n", link.B, "tuntap", "add", "tap0", "mode", "tap")
	ip(t, "-n", link.B, "link", "set", "tap0", "master", "br0")
	for _, dev := range []string{"br0", "tap0"} {
		ip(t, "-n", link.B, "link", "set", dev, "up")
	}
	guestAddr := link.AAddr[:len(link.AAddr)-1] + "10"

	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.qcow2")
	if out, err := exec.Command(filepath.Join(qemu, "bin", "qemu-img"), "create", "-f", "qcow2", disk, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v\n%s", err, out)
	}
	vm := guestVM(qemu, guest, dir, "guest", guestAddr)
	proc := startQEMU(t, link.B, qemu, append(vm.Args("guest"), "-drive", "if=virtio,id=disk0,driver=qcow2,file="+disk), filepath.Join(dir, "qemu.log"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	q := dialQMP(t, ctx, proc, vm.QMP)
	var status struct {
		Running bool   `json:"running"`
		Status  string `json:"status"`
	}
	if err := q.Execute(ctx, "query-status", nil, &status); err != nil || !status.Running {
		t.Fatalf("query-status: %+v %v", status, err)
	}

	var boot string
	start := time.Now()
	for i := 1; i <= 3; i++ {
		var count, onDisk int
		var id string
		var err error
		for {
			if count, id, onDisk, err = ask(link.A, guestAddr+":7777"); err == nil || ctx.Err() != nil {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if err != nil {
			console, _ := os.ReadFile(vm.Serial)
			t.Fatalf("the guest never answered: %v\nconsole:\n%s", err, console)
		}
		if i == 1 {
			boot = id
			t.Logf("the guest answered %s after QEMU started", time.Since(start).Round(time.Millisecond))
		}
		if count != i || onDisk != i || id != boot {
			t.Fatalf("request %d: count %d, disk %d, boot id %s (first %s)", i, count, onDisk, id, boot)
		}
	}
}

// qemuProc is a QEMU run by a test; done is closed when it exits, with err its end.
type qemuProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startQEMU runs QEMU inside namespace ns, logging to log; it is killed when the test ends.
func startQEMU(t *testing.T, ns, qemu string, args []string, log string) *qemuProc {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, filepath.Join(qemu, "bin", "qemu-system-x86_64")}, args...)...)
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &qemuProc{cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); _ = f.Close(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	return p
}

// dialQMP connects to the QEMU's QMP socket once it is up, failing at once if QEMU exits.
func dialQMP(t *testing.T, ctx context.Context, p *qemuProc, sock string) *qmp.Conn {
	q, err := qmp.DialWhenUp(ctx, sock, p.done)
	if err != nil {
		select {
		case <-p.done:
			t.Fatalf("%v: %v", err, p.err)
		default:
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = q.Close() })
	return q
}
