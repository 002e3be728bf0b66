package lockstepd

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/relay"
)

func TestMemberOfAVMI(t *testing.T) {
	vmi := func(role string) *virtv1.VirtualMachineInstance {
		return &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "db-2", UID: "0b5a4c3e-1d2f-4a6b-9c8d-7e6f5a4b3c2d",
			Labels: map[string]string{ftv1.LabelPair: "db", ftv1.LabelRole: role}}}
	}
	for _, tc := range []struct {
		role    string
		primary bool
	}{{ftv1.RolePrimary, true}, {ftv1.RoleSecondary, false}, {ftv1.RoleFenced, false}} {
		got := MemberOf(vmi(tc.role), "node-3")
		want := MemberSpec{Pair: "prod/db", VMI: "db-2", UID: "0b5a4c3e-1d2f-4a6b-9c8d-7e6f5a4b3c2d", Identity: "node-3/db-2", Primary: tc.primary}
		if got != want {
			t.Errorf("%s: %+v, want %+v", tc.role, got, want)
		}
	}
	n := &Node{Config: Config{RunDir: "/var/run/lockstep"}}
	if d := n.Dir(MemberOf(vmi(ftv1.RolePrimary), "node-3")); d != "/var/run/lockstep/0b5a4c3e-1d2f-4a6b-9c8d-7e6f5a4b3c2d" {
		t.Errorf("member directory %s", d)
	}
}

// TestAMemberDirectoryIsQEMUsUsers: lockstepd makes each member's directory for the user the
// launcher runs QEMU as (KubeVirt's 107), who makes its sockets there, and only that user and
// lockstepd reach it; a directory that is there (lockstepd restarted, or a kubelet made it) is
// given to that user again.
func TestAMemberDirectoryIsQEMUsUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving a directory to another user needs root (CI runs as root)")
	}
	qemu := &relay.Owner{UID: 107, GID: 107}
	check := func(dir string, uid, gid int) {
		t.Helper()
		st, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		if int(sys.Uid) != uid || int(sys.Gid) != gid || st.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %d:%d %v, want %d:%d 0700", dir, sys.Uid, sys.Gid, st.Mode().Perm(), uid, gid)
		}
	}
	dir := filepath.Join(t.TempDir(), "0c4e2f1a")
	for range 2 {
		if err := PrepareMemberDir(dir, qemu, DefaultMemberDirLabel); err != nil {
			t.Fatal(err)
		}
		check(dir, 107, 107)
	}
	made := filepath.Join(t.TempDir(), "made-by-a-kubelet")
	if err := os.Mkdir(made, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := PrepareMemberDir(made, qemu, DefaultMemberDirLabel); err != nil {
		t.Fatal(err)
	}
	check(made, 107, 107)
	root := filepath.Join(t.TempDir(), "qemu-as-root")
	if err := PrepareMemberDir(root, nil, DefaultMemberDirLabel); err != nil {
		t.Fatal(err)
	}
	check(root, 0, 0)
}

// TestTheDirectoriesOfMembersPlacedHereAreMadeBeforeTheyRun: lockstepd makes a member's directory
// as soon as placement put the member on its node (the ft.lockstep.dev/node label), before the
// launcher pod runs (it waits for the directory) and so before KubeVirt names the node in the
// VMI's status; not for members of other nodes, fenced, ended or being deleted ones.
func TestTheDirectoriesOfMembersPlacedHereAreMadeBeforeTheyRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving a directory to another user needs root (CI runs as root)")
	}
	now := metav1.Now()
	vmi := func(name, uid, node, role string, edit func(*virtv1.VirtualMachineInstance)) virtv1.VirtualMachineInstance {
		v := virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: name, UID: types.UID(uid),
			Labels: map[string]string{ftv1.LabelPair: "db", ftv1.LabelRole: role, ftv1.LabelNode: node}}}
		if edit != nil {
			edit(&v)
		}
		return v
	}
	d := &Daemon{Config: Config{NodeName: "node-1", RunDir: t.TempDir(), LauncherUser: "107:107"}}
	errs := d.prepareDirs([]virtv1.VirtualMachineInstance{
		vmi("db-1", "u-scheduling", "node-1", ftv1.RoleSecondary, nil),
		vmi("db-2", "u-elsewhere", "node-2", ftv1.RolePrimary, nil),
		vmi("db-3", "u-fenced", "node-1", ftv1.RoleFenced, nil),
		vmi("db-4", "u-deleted", "node-1", ftv1.RoleSecondary, func(v *virtv1.VirtualMachineInstance) { v.DeletionTimestamp = &now }),
		vmi("db-5", "u-failed", "node-1", ftv1.RoleSecondary, func(v *virtv1.VirtualMachineInstance) { v.Status.Phase = virtv1.Failed }),
	})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	for uid, want := range map[string]bool{"u-scheduling": true, "u-elsewhere": false, "u-fenced": false, "u-deleted": false, "u-failed": false} {
		st, err := os.Stat(filepath.Join(d.Config.RunDir, uid))
		if got := err == nil; got != want {
			t.Errorf("%s: made %v, want %v", uid, got, want)
		} else if got && st.Sys().(*syscall.Stat_t).Uid != 107 {
			t.Errorf("%s is not QEMU's user's", uid)
		}
	}
}

// TestAMemberDirectoryIsLabelledForItsLauncherWhereSELinuxRuns: on a node that runs SELinux, a
// member's directory gets the label the launcher's QEMU may use (the kernel stores it as the
// directory's security.selinux attribute, which is what SELinux reads); elsewhere it gets none.
// This machine runs no SELinux: the test points lockstepd's probe at a directory that stands for
// the SELinux filesystem, and checks the attribute the kernel stored.
func TestAMemberDirectoryIsLabelledForItsLauncherWhereSELinuxRuns(t *testing.T) {
	label := func(dir string) string {
		buf := make([]byte, 256)
		n, err := unix.Lgetxattr(dir, "security.selinux", buf)
		if err != nil {
			return ""
		}
		return strings.TrimRight(string(buf[:n]), "\x00")
	}
	old := selinuxFS
	t.Cleanup(func() { selinuxFS = old })

	selinuxFS = filepath.Join(t.TempDir(), "no-selinux")
	plain := filepath.Join(t.TempDir(), "plain")
	if err := PrepareMemberDir(plain, nil, DefaultMemberDirLabel); err != nil {
		t.Fatal(err)
	}
	if l := label(plain); l != "" {
		t.Fatalf("labelled %q on a node without SELinux", l)
	}

	selinuxFS = t.TempDir()
	if err := os.WriteFile(filepath.Join(selinuxFS, "enforce"), []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "0c4e2f1a")
	for range 2 { // idempotent
		if err := PrepareMemberDir(dir, nil, DefaultMemberDirLabel); err != nil {
			t.Fatal(err)
		}
		if l := label(dir); l != DefaultMemberDirLabel {
			t.Fatalf("the member's directory is labelled %q, want %q", l, DefaultMemberDirLabel)
		}
	}
	unlabelled := filepath.Join(t.TempDir(), "unlabelled")
	if err := PrepareMemberDir(unlabelled, nil, ""); err != nil {
		t.Fatal(err)
	}
	if l := label(unlabelled); l != "" {
		t.Fatalf("--member-dir-selinux-label empty, yet labelled %q", l)
	}
}
