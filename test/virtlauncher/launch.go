package virtlauncher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	virtv1 "kubevirt.io/api/core/v1"

	"github.com/lockstep-dev/lockstep/internal/kubevirthook"
	"github.com/lockstep-dev/lockstep/internal/kubevirtsize"
)

// Member is what virt-launcher has of a member VMI when it starts its domain.
type Member struct {
	// VMI is the VMI as virt-launcher sends it to the hook.
	VMI *virtv1.VirtualMachineInstance
	// Sizing is the cluster's KubeVirt configuration that sized the launcher pod, whose memory
	// limit the launcher's cgroup enforces.
	Sizing kubevirtsize.Cluster
	// Domain is the domain before the hook.
	Domain DomainSpec
	// NetNS is the node's network namespace, where the daemon and QEMU run.
	NetNS string
	// StateDir holds the hook's socket and the daemon's state (short: socket paths end at 107
	// bytes). HookBin is the hook binary; RunDir the members' directory it is given; Log the
	// directory for the hook's log and the domain's XML.
	StateDir, HookBin, RunDir, Log string
	// Paused starts the domain paused: the secondary's VMI has startStrategy Paused (it waits
	// for its primary's state, and libvirt must not resume it).
	Paused bool
	// Shares are host directories the domain's QEMU reads (path in the launcher -> host
	// directory): what the launcher image carries (LauncherShares), and what the launcher pod
	// mounts, such as lockstep's QEMU image at /usr/local/lockstep. The domain's kernel paths
	// under them are given as the launcher sees them.
	Shares map[string]string
}

// LauncherShares are the host directories that stand for files of KubeVirt's launcher image, at
// its paths: OVMF (hack/qemu.sh's, Debian's) where KubeVirt's image has OVMF, and the test guest
// (the busybox guest's kernel) at /usr/local/lockstep-guest. lockstep's QEMU is not among them:
// the launcher pod mounts it (QEMUImageMount).
func LauncherShares(qemu, guest string) map[string]string {
	return map[string]string{ovmfDir: filepath.Join(qemu, "firmware", "ovmf"), "/usr/local/lockstep-guest": guest}
}

// QEMUImageMount is where a member's launcher pod mounts lockstep's QEMU image
// (config/kubevirt/member-qemu-policy.yaml), under which the hook names the emulator.
const QEMUImageMount = kubevirthook.LockstepQEMUMount

// inLauncher is path as the launcher sees it: under the share whose host directory holds it.
func (m Member) inLauncher(path string) string {
	for in, host := range m.Shares {
		if rel, err := filepath.Rel(host, path); err == nil && !strings.HasPrefix(rel, "..") {
			return filepath.Join(in, rel)
		}
	}
	return path
}

// Launched is a member's running domain.
type Launched struct {
	Libvirtd *Libvirtd
	Hook     *Hook
	Domain   string
	// Cgroup is the compute container's memory cgroup, with the limit KubeVirt gives it (nil
	// where the VMI has no memory limit, or the machine no memory cgroup: see ErrNoMemoryCgroup).
	Cgroup *MemoryCgroup
	// PID is QEMU's; Exited closes when it is gone.
	PID    int
	Exited chan struct{}
}

// Launch starts the member's domain as virt-launcher does: its hook sidecar, the domain through
// the hook, its own libvirt daemon, define and start.
func Launch(ctx context.Context, m Member) (_ *Launched, err error) {
	if err := os.MkdirAll(m.StateDir, 0o700); err != nil {
		return nil, err
	}
	l := &Launched{Domain: m.Domain.Name, Exited: make(chan struct{})}
	defer func() {
		if err != nil {
			l.Stop()
			l.RemoveCgroup()
		}
	}()
	if l.Hook, err = StartHook(m.HookBin, m.StateDir, m.RunDir, filepath.Join(m.Log, "hook.log")); err != nil {
		return nil, err
	}
	spec := m.Domain
	spec.VM.Kernel, spec.VM.Initrd = m.inLauncher(spec.VM.Kernel), m.inLauncher(spec.VM.Initrd)
	dom := Domain(spec)
	vmi, err := json.Marshal(m.VMI)
	if err != nil {
		return nil, err
	}
	if l.Cgroup, err = launcherCgroup(m); err != nil {
		return nil, err
	}
	if l.Libvirtd, err = StartLibvirtd(filepath.Join(m.StateDir, "lv"), m.NetNS, m.Shares, l.Cgroup); err != nil {
		return nil, err
	}
	if err := giveToQEMU(l.Libvirtd, m.Domain); err != nil {
		return nil, err
	}
	hctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	hook := func(in []byte) ([]byte, error) { return l.Hook.OnDefineDomain(hctx, in, vmi) }
	xml := filepath.Join(m.Log, "domain.xml")
	if _, err := DefineSequence(dom, hook, func(out []byte) ([]byte, error) { return l.Libvirtd.Define(xml, out) }); err != nil {
		return nil, err
	}
	start := []string{"start", m.Domain.Name}
	if m.Paused {
		start = append(start, "--paused")
	}
	if _, err := l.Libvirtd.Virsh(start...); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, l.Libvirtd.LogTail())
	}
	if l.PID, err = l.Libvirtd.DomainPID(m.Domain.Name); err != nil {
		return nil, err
	}
	go func() {
		for alive(l.PID) {
			time.Sleep(20 * time.Millisecond)
		}
		close(l.Exited)
	}()
	return l, nil
}

// tcgCacheMiB caps TCG's translation cache (forThisMachine): QEMU under KVM has none, and KubeVirt's
// overhead does not count one, so the double adds it to the launcher's limit. Its default, an
// eighth of the host's memory up to 1 GiB, grows as the guest runs new code.
const tcgCacheMiB = 256

// notRunMiB is KubeVirt's allowance for the launcher's processes that the double does not run
// (virt-launcher-monitor 25 MiB, virt-launcher 100 MiB, virtlogd 25 MiB): taken off the limit, so
// that what the double runs (libvirt's daemon and QEMU) has no more room than in KubeVirt's pod.
const notRunMiB = 25 + 100 + 25

// launcherCgroup is the memory cgroup of the member's compute container, with KubeVirt's limit
// for its VMI (LauncherMemory), less what the double does not run, plus the TCG cache: nil where
// the VMI has no memory limit (kubelet sets none), and nil, with nothing enforced, where this
// machine has no memory cgroup.
func launcherCgroup(m Member) (*MemoryCgroup, error) {
	_, limit, err := kubevirtsize.LauncherMemory(m.VMI, m.Sizing)
	if err != nil || limit.IsZero() {
		return nil, err
	}
	c, err := NewMemoryCgroup("lockstep-launcher-"+m.Domain.Name+"-"+short(m.Domain.VMIUID), limit.Value()+(tcgCacheMiB-notRunMiB)<<20)
	if errors.Is(err, ErrNoMemoryCgroup) {
		return nil, nil
	}
	return c, err
}

func short(s string) string { return s[:min(len(s), 8)] }

// giveToQEMU lays the member's files out as KubeVirt's launcher has them for QEMUUser: its
// directory of sockets (VNC, console) in kubevirt-private, and each file QEMU opens that libvirt
// does not give it (the hook takes the disks out of libvirt's hands; the console's log), linked
// at KubeVirt's path and owned by QEMUUser, as virt-handler and the launcher leave them (a claim's
// disk.img is the qemu user's, an emptyDisk is made by the launcher, which runs as that user).
func giveToQEMU(d *Libvirtd, s DomainSpec) error {
	dir := d.HostPath(launcherFile(s.VMIUID, ""))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.Chown(dir, QEMUUser.UID, QEMUUser.GID); err != nil {
		return err
	}
	if s.EFI { // the launcher's directory where libvirt makes the NVRAM from OVMF's VARS template
		nvram := d.HostPath(nvramDir)
		if err := os.MkdirAll(nvram, 0o755); err != nil {
			return err
		}
		if err := os.Chown(nvram, QEMUUser.UID, QEMUUser.GID); err != nil {
			return err
		}
	}
	for path, target := range launcherFiles(s) {
		f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o644) // the console's log may not exist yet
		if err != nil {
			return err
		}
		_ = f.Close()
		if err := os.Chown(target, QEMUUser.UID, QEMUUser.GID); err != nil {
			return err
		}
		if err := d.Link(path, target); err != nil {
			return err
		}
	}
	return nil
}

// Running reports whether the domain's QEMU runs.
func (l *Launched) Running() bool {
	select {
	case <-l.Exited:
		return false
	default:
		return l.PID != 0
	}
}

// Destroy is what virt-launcher does when its VMI is deleted: libvirt destroys the domain (it
// falls back to SIGKILL when the daemon does not answer), then the daemon and the hook end.
func (l *Launched) Destroy() {
	if l.Libvirtd != nil && l.Running() {
		if _, err := l.Libvirtd.Virsh("destroy", l.Domain); err != nil {
			_ = syscall.Kill(l.PID, syscall.SIGKILL)
		}
	}
	l.Stop()
	l.RemoveCgroup()
}

// Kill is the host dying under the domain: QEMU, the daemon and the hook are killed (SIGKILL).
func (l *Launched) Kill() {
	if l.PID != 0 {
		_ = syscall.Kill(l.PID, syscall.SIGKILL)
		<-l.Exited
	}
	l.Stop()
	l.RemoveCgroup()
}

// RemoveCgroup removes the launcher's memory cgroup, once QEMU is gone.
func (l *Launched) RemoveCgroup() {
	if l.Cgroup != nil {
		l.Cgroup.Remove()
	}
}

// Stop ends the daemon and the hook; the domain's QEMU runs on.
func (l *Launched) Stop() {
	if l.Libvirtd != nil {
		l.Libvirtd.Kill()
	}
	if l.Hook != nil {
		l.Hook.Stop()
	}
}

// alive says whether process pid runs. A QEMU that died is a zombie until libvirtd reaps it,
// which libvirtd does only once it has torn the domain down (a second or two after a kill -9):
// a zombie runs no more.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: the state follows the last ')', as comm may hold one.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}
