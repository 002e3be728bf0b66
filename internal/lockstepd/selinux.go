package lockstepd

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// DefaultMemberDirLabel is the SELinux label a member's directory gets on a node that runs
// SELinux: the type container-selinux gives what containers may read and write, at level s0,
// which every launcher's categories dominate. lockstepd makes the directory under its run
// directory, where it would inherit a type the launcher's QEMU (container_t) may not use; the
// kubelet never relabels a hostPath.
const DefaultMemberDirLabel = "system_u:object_r:container_file_t:s0"

// selinuxFS is where the kernel's SELinux filesystem is mounted when SELinux runs.
var selinuxFS = "/sys/fs/selinux"

// selinuxEnabled says whether this node runs SELinux.
func selinuxEnabled() bool {
	_, err := os.Stat(filepath.Join(selinuxFS, "enforce"))
	return err == nil
}

// labelMemberDir gives dir the SELinux label (none: left as it is) where SELinux runs, and
// leaves a directory that has it already alone.
func labelMemberDir(dir, label string) error {
	if label == "" || !selinuxEnabled() {
		return nil
	}
	const attr = "security.selinux"
	buf := make([]byte, 256)
	if n, err := unix.Lgetxattr(dir, attr, buf); err == nil && string(bytes.TrimRight(buf[:n], "\x00")) == label {
		return nil
	}
	if err := unix.Lsetxattr(dir, attr, []byte(label), 0); err != nil {
		return fmt.Errorf("labelling the member's directory %s for SELinux (%s): %w", dir, label, err)
	}
	return nil
}
