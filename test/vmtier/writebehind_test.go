//go:build linux && vmtier

package vmtier

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/colo"
	"github.com/lockstep-dev/lockstep/internal/qmp"
	"github.com/lockstep-dev/lockstep/internal/testnet"
)

// TestReplicationPrimaryWritesBehind: on COLO's primary each disk is a quorum of the local disk
// and the replication filter whose child is the NBD client of the secondary's disk. The quorum
// completed a guest write only once the secondary's disk had it too, so every write waited a
// round trip to the secondary; protected random writes kept a fifth of their throughput
// (docs/performance.md). lockstep's QEMU completes the write once it is copied and sends the copy
// behind it (hack/qemu/replication-primary-write-behind.patch): the checkpoint's drain waits for
// the copies, a flush waits for those before it, two writes of one place reach the secondary in
// order, and one that fails fails the next checkpoint.
//
// The chain is the one lockstep builds on the primary (colo.PrimaryDiskArgs' quorum, and the
// replication child colo.StartPrimary adds with colo.ReplicationDriveAdd), in a QEMU with no
// guest; qemu-nbd stands in for the secondary's NBD server, exporting the replica as the
// secondary's parent0, and stopping it (SIGSTOP) for a secondary that is slow or gone. The writes
// are qemu-io's, through HMP, on the quorum's drive, which keeps its BlockBackend as a guest's disk
// does (qemu-io on a bare node makes one of its own and drains the node when it drops it).
func TestReplicationPrimaryWritesBehind(t *testing.T) {
	qemu := build(t, "qemu.sh")
	dir := t.TempDir()
	local, remote := filepath.Join(dir, "local.raw"), filepath.Join(dir, "secondary.raw")
	for _, f := range []string{local, remote} {
		qemuImg(t, qemu, "create", "-f", "raw", f, "4M")
	}
	sockets := colo.Sockets{Dir: dir}
	nbdSock := sockets.Path(colo.StreamNBD)
	nbd := exec.Command(filepath.Join(qemu, "bin", "qemu-nbd"), "-f", "raw", "-x", "parent0", "-k", nbdSock, "-t", remote)
	nbd.Stdout, nbd.Stderr = os.Stderr, os.Stderr
	if err := nbd.Start(); err != nil {
		t.Fatal(err)
	}
	nbdDone := make(chan struct{})
	go func() { _ = nbd.Wait(); close(nbdDone) }()
	t.Cleanup(func() {
		_ = nbd.Process.Signal(syscall.SIGCONT)
		_ = nbd.Process.Kill()
		<-nbdDone
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(nbdSock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("qemu-nbd made no socket in 30 s")
		}
	}

	qmpSock := filepath.Join(dir, "qmp.sock")
	proc := startQEMU(t, testnet.NewNS(t), qemu, append([]string{"-machine", "none", "-nodefaults", "-display", "none",
		"-qmp", "unix:" + qmpSock + ",server=on,wait=off"},
		colo.PrimaryDiskArgs(0, colo.Image{Format: "raw", Path: local})...), filepath.Join(dir, "qemu.log"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	q := dialQMP(t, ctx, proc, qmpSock)
	if _, err := q.HMP(ctx, colo.ReplicationDriveAdd(sockets, 0)); err != nil {
		t.Fatal(err)
	}
	if err := q.Execute(ctx, "x-blockdev-change", map[string]any{"parent": colo.DiskNode(0), "node": colo.ReplicationNode(0)}, nil); err != nil {
		t.Fatal(err)
	}
	// What COLO's start does on the primary (replication_start_all), without a migration.
	if err := q.Execute(ctx, "xen-set-replication", map[string]any{"enable": true, "primary": true}, nil); err != nil {
		t.Fatal(err)
	}

	// The secondary answers nothing: each write must complete anyway, the second of one place
	// after the first.
	if err := nbd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"write -P 0x11 0 64k", "write -P 0x22 0 64k", "write -P 0x33 64k 64k"} {
		qemuIO(t, q, w, 10*time.Second, "with the secondary's NBD server stopped")
	}
	if s := replicationStatus(t, q); s.Error {
		t.Fatalf("replication reports an error before any: %s", s.Desc)
	}

	// The flush waits for what the writes left on their way, and then the secondary's disk has
	// the later write of one place, not the earlier.
	if err := nbd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	qemuIO(t, q, "flush", 30*time.Second, "")
	got, err := os.ReadFile(remote)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		from, to int
		b        byte
	}{{0, 64 << 10, 0x22}, {64 << 10, 128 << 10, 0x33}, {128 << 10, 192 << 10, 0}} {
		if !bytes.Equal(got[r.from:r.to], bytes.Repeat([]byte{r.b}, r.to-r.from)) {
			t.Fatalf("the secondary's disk at [%d, %d) holds %#x..., want %#x", r.from, r.to, got[r.from], r.b)
		}
	}
	if err := q.Execute(ctx, "xen-colo-do-checkpoint", nil, nil); err != nil {
		t.Fatalf("a checkpoint after every write reached the secondary: %v", err)
	}

	// A write that never reaches the secondary: the guest's write completed, so the error must
	// surface where COLO looks, and the next checkpoint must not commit a disk that misses it.
	if err := nbd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	qemuIO(t, q, "write -P 0x44 128k 64k", 10*time.Second, "with the secondary's NBD server stopped")
	_ = nbd.Process.Kill()
	<-nbdDone
	qemuIO(t, q, "flush", 30*time.Second, "") // the local disk's flush succeeds; the quorum reports the other child
	if s := replicationStatus(t, q); !s.Error {
		t.Fatal("replication reports no error after a write to the secondary failed")
	}
	err = q.Execute(ctx, "xen-colo-do-checkpoint", nil, nil)
	if err == nil || !strings.Contains(err.Error(), "A write to the secondary failed") {
		t.Fatalf("a checkpoint after a write to the secondary failed: %v, want that write's error", err)
	}
	if onLocal, err := os.ReadFile(local); err != nil || onLocal[128<<10] != 0x44 {
		t.Fatalf("the local disk misses the write the guest was told is done (%v)", err)
	}
}

// qemuIO runs a qemu-io command on the quorum colo.DiskNode(0) through HMP, failing the test if it takes
// longer than limit (while says under what) or reports an error.
func qemuIO(t *testing.T, q *qmp.Conn, command string, limit time.Duration, while string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	out, err := q.HMP(ctx, "qemu-io "+colo.DiskNode(0)+` "`+command+`"`)
	if err != nil {
		t.Fatalf("qemu-io %q %s: %v (the write waited for the secondary)", command, while, err)
	}
	if strings.Contains(out, "error") || strings.Contains(out, "failed") {
		t.Fatalf("qemu-io %q: %s", command, out)
	}
}

// replicationStatus is what the primary's replication says of its errors (the replication
// nodes' error, as COLO reads it).
func replicationStatus(t *testing.T, q *qmp.Conn) (s struct {
	Error bool   `json:"error"`
	Desc  string `json:"desc"`
}) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := q.Execute(ctx, "query-xen-replication-status", nil, &s); err != nil {
		t.Fatal(err)
	}
	return s
}
