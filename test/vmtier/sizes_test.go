//go:build linux && vmtier

package vmtier

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockstep-dev/lockstep/internal/colo"
)

// TestASecondaryOpensItsReplicaAtTheDisksSize runs lockstep's QEMU on a secondary's disk chain
// (colo.SecondaryDiskArgs, as the KubeVirt hook gives it) with a replica larger than the disk, as
// a copy's claim is, and its overlays of the disk's size: QEMU opens it, and the replica's size
// is the disk's. With a replica smaller than the disk (a storage class whose filesystem takes
// more than the copy's margin), QEMU refuses to start, naming both sizes: the words KubeVirt puts
// in the VMI's Synchronized condition, which the operator shows (health.kubevirtSays). The other
// COLO tests run every secondary on a replica 8 MiB larger than its disk.
func TestASecondaryOpensItsReplicaAtTheDisksSize(t *testing.T) {
	qemu := build(t, "qemu.sh")
	dir := t.TempDir()
	const disk = 64 << 20
	run := func(replica int64) (string, error) {
		parent, active, hidden := filepath.Join(dir, "parent.img"), filepath.Join(dir, "active.qcow2"), filepath.Join(dir, "hidden.qcow2")
		qemuImg(t, qemu, "create", "-f", "raw", parent, fmt.Sprint(replica))
		qemuImg(t, qemu, "create", "-f", "qcow2", active, fmt.Sprint(disk))
		qemuImg(t, qemu, "create", "-f", "qcow2", hidden, fmt.Sprint(disk))
		args := append([]string{"-L", filepath.Join(qemu, "firmware", "qemu"), "-L", filepath.Join(qemu, "firmware", "seabios"),
			"-accel", "tcg", "-nodefaults", "-display", "none", "-S", "-qmp", "stdio"},
			colo.SecondaryDiskArgs(0, colo.Image{Path: parent, Format: "raw", Bytes: disk}, active, hidden)...)
		cmd := exec.Command(filepath.Join(qemu, "bin", "qemu-system-x86_64"), args...)
		cmd.Stdin = strings.NewReader(`{"execute":"qmp_capabilities"}` + "\n" + `{"execute":"query-block"}` + "\n" + `{"execute":"quit"}` + "\n")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run(disk + 8<<20)
	if err != nil {
		t.Fatalf("a replica 8 MiB larger than the disk: %v\n%s", err, out)
	}
	if !strings.Contains(out, `"device": "colo-disk0"`) || !strings.Contains(out, fmt.Sprintf(`"virtual-size": %d`, disk)) {
		t.Fatalf("the secondary's disk is not the disk's %d bytes:\n%s", disk, out)
	}
	out, err = run(disk - 1<<20)
	if err == nil || !strings.Contains(out, fmt.Sprintf("size (%d)", disk)) || !strings.Contains(out, fmt.Sprintf("(%d)", disk-1<<20)) {
		t.Fatalf("a replica 1 MiB smaller than the disk: %v, want QEMU to refuse it naming both sizes:\n%s", err, out)
	}
	t.Logf("QEMU on a short replica: %s", strings.TrimSpace(out))
}
