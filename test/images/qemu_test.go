package images

import (
	"bufio"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/lockstep-dev/lockstep/internal/kubevirthook"
	"github.com/lockstep-dev/lockstep/test/imagevolume"
)

const (
	qemuArchive = "../../bin/images/lockstep-qemu.oci.tar"
	// qemuUser is QEMU's user in KubeVirt's launcher.
	qemuUser = 107
)

// qemuImage is the registry of the QEMU image's archive, and the image's reference in it.
func qemuImage(t *testing.T) (*imagevolume.Registry, string) {
	t.Helper()
	reg := &imagevolume.Registry{Archives: []string{qemuArchive}, Dir: t.TempDir()}
	refs, err := reg.Refs()
	if err != nil || len(refs) != 1 {
		t.Fatalf("%s: images %q, %v; want one (make images)", qemuArchive, refs, err)
	}
	return reg, refs[0]
}

// qemuVersion is the QEMU version hack/qemu.sh builds (major, minor, micro of Debian's version).
func qemuVersion(t *testing.T) [3]int {
	t.Helper()
	script, err := os.ReadFile("../../hack/qemu.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`QEMU_DEB_VERSION:-(\d+)\.(\d+)\.(\d+)`).FindStringSubmatch(string(script))
	if m == nil {
		t.Fatal("hack/qemu.sh names no QEMU_DEB_VERSION")
	}
	var v [3]int
	for i := range v {
		v[i], _ = strconv.Atoi(m[i+1])
	}
	return v
}

// TestQEMUImage: lockstep's QEMU image is mounted, not run: no entrypoint, QEMU's user, and the
// path it must be mounted at, which is where its binary's interpreter and library path point and
// where the hook names the emulator. Mounted there in an otherwise empty root (a chroot with
// nothing else: no /proc, no /dev, no library of this host's), its QEMU starts as uid 107 on
// KubeVirt's machine with a VGA, a virtio NIC and VNC (SeaBIOS, the VGA BIOS and iPXE's ROM
// load from the image), and reports over QMP its version and COLO: the x-colo capability and
// lockstep's x-colo-ram-ahead, colo-compare and the packet filters, and the quorum and
// replication block drivers.
func TestQEMUImage(t *testing.T) {
	reg, qemuRef := qemuImage(t)
	cf, err := reg.Config(qemuRef)
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "107:107" || len(cf.Config.Entrypoint) != 0 || len(cf.Config.Cmd) != 0 {
		t.Errorf("user %q, entrypoint %q, cmd %q: want 107:107 and neither (the image is mounted, not run)", cf.Config.User, cf.Config.Entrypoint, cf.Config.Cmd)
	}
	mount := cf.Config.Labels["dev.lockstep.mount-path"]
	if want := kubevirthook.LockstepQEMUMount; mount != want {
		t.Fatalf("the image's mount path %q, want %q (the hook's emulator is %s)", mount, want, kubevirthook.LockstepQEMU)
	}
	image, _, err := reg.Pull(qemuRef)
	if err != nil {
		t.Fatal(err)
	}
	binary := filepath.Join(image, strings.TrimPrefix(kubevirthook.LockstepQEMU, mount))
	f, err := elf.Open(binary)
	if err != nil {
		t.Fatal(err)
	}
	interp := ""
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				t.Fatal(err)
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	rpath, _ := f.DynString(elf.DT_RPATH)
	runpath, _ := f.DynString(elf.DT_RUNPATH)
	_ = f.Close()
	if interp != mount+"/lib/ld-linux-x86-64.so.2" || !slices.Equal(rpath, []string{mount + "/lib"}) || len(runpath) != 0 {
		t.Fatalf("the binary's interpreter %q, RPATH %q, RUNPATH %q: want the image's own loader and libraries at %s", interp, rpath, runpath, mount)
	}

	// An empty root with the image at its mount path and a /tmp: nothing else.
	root := t.TempDir()
	for _, d := range []string{"usr/local", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(image, filepath.Join(root, strings.TrimPrefix(mount, "/"))); err != nil {
		t.Fatal(err)
	}
	run := func(stdin string, args ...string) string {
		t.Helper()
		cmd := exec.Command(kubevirthook.LockstepQEMU, args...)
		cmd.Dir = "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Credential: &syscall.Credential{Uid: qemuUser, Gid: qemuUser}}
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s, in a root of only the image, as uid %d: %v\n%s", kubevirthook.LockstepQEMU, strings.Join(args, " "), qemuUser, err, out)
		}
		return string(out)
	}
	if os.Geteuid() != 0 {
		t.Fatal("chroot and uid 107 need root (CI runs the tests as root)")
	}

	formats := run("", "-drive", "format=help")
	for _, d := range []string{"quorum", "replication", "nbd", "qcow2", "raw"} {
		if !strings.Contains(formats, " "+d) {
			t.Errorf("no %s block driver: %s", d, formats)
		}
	}

	qmp := []string{
		`{"execute":"qmp_capabilities"}`,
		`{"execute":"query-version","id":"version"}`,
		`{"execute":"query-migrate-capabilities","id":"caps"}`,
		`{"execute":"qom-list-types","id":"types"}`,
		`{"execute":"query-vnc","id":"vnc"}`,
		`{"execute":"query-qmp-schema","id":"schema"}`,
		`{"execute":"quit"}`,
	}
	out := run(strings.Join(qmp, "\n")+"\n", "-machine", "q35", "-accel", "tcg", "-nodefaults", "-display", "none",
		"-vnc", "unix:/tmp/vnc.sock", "-vga", "std", "-device", "virtio-net-pci,id=nic", "-S", "-qmp", "stdio")
	replies := map[string]json.RawMessage{}
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r struct {
			ID     string          `json:"id"`
			Return json.RawMessage `json:"return"`
		}
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.ID != "" {
			replies[r.ID] = r.Return
		}
	}
	var version struct {
		QEMU struct{ Major, Minor, Micro int } `json:"qemu"`
	}
	if want := qemuVersion(t); json.Unmarshal(replies["version"], &version) != nil ||
		[3]int{version.QEMU.Major, version.QEMU.Minor, version.QEMU.Micro} != want {
		t.Errorf("query-version: %s, want %v (hack/qemu.sh)", replies["version"], want)
	}
	var caps []struct{ Capability string }
	_ = json.Unmarshal(replies["caps"], &caps)
	for _, want := range []string{"x-colo", "x-colo-ram-ahead"} {
		if !slices.ContainsFunc(caps, func(c struct{ Capability string }) bool { return c.Capability == want }) {
			t.Errorf("no migration capability %s: %s", want, replies["caps"])
		}
	}
	var types []struct{ Name string }
	_ = json.Unmarshal(replies["types"], &types)
	for _, want := range []string{"colo-compare", "filter-mirror", "filter-redirector", "filter-rewriter"} {
		if !slices.ContainsFunc(types, func(ty struct{ Name string }) bool { return ty.Name == want }) {
			t.Errorf("no QOM type %s", want)
		}
	}
	// colo-compare's crossed wait (lockstepd --colo-crossed-wait), which object-add takes only
	// where the schema has it.
	if !strings.Contains(string(replies["schema"]), `"name": "x-crossed-timeout"`) {
		t.Errorf("no x-crossed-timeout in QEMU's QAPI schema (hack/qemu/colo-compare-waits-crossed.patch)")
	}
	if !strings.Contains(string(replies["vnc"]), `"enabled": true`) {
		t.Errorf("VNC: %s", replies["vnc"])
	}
	if t.Failed() {
		t.Logf("QEMU's output:\n%s", out)
	}
}

// TestQEMUImageIsReproducible builds the QEMU image again from the same files: the same digest.
func TestQEMUImageIsReproducible(t *testing.T) {
	_, qemuRef := qemuImage(t)
	again := filepath.Join(t.TempDir(), "again.oci.tar")
	cmd := exec.Command("go", "run", "./hack/imagebuild", "-root", "bin/qemu-image", "-mount", kubevirthook.LockstepQEMUMount,
		"-out", again, "-ref", qemuRef, "-version", versionLabel(t, qemuArchive))
	cmd.Dir = filepath.Join("..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if a, b := indexDigest(t, qemuArchive), indexDigest(t, again); a != b {
		t.Fatalf("two builds of the same files: %s and %s", a, b)
	}
}
