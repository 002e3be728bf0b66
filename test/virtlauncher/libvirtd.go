package virtlauncher

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/lockstep-dev/lockstep/internal/relay"
)

// Libvirtd is one VMI's libvirt daemon. It runs in the node's network namespace with a mount
// namespace of its own, in which directories of the VMI's are bound over libvirt's fixed paths,
// so that several daemons run side by side on one host.
type Libvirtd struct {
	// Dir holds the daemon's state: etc, run, lib, log and cache.
	Dir string
	// NetNS is the node's network namespace.
	NetNS string
	// Sock is the daemon's socket.
	Sock string
	// Shares are directories of the host that the daemon's QEMU reads, bound read-only at paths
	// of its mount namespace (path there -> host directory): lockstep's QEMU and the test guest,
	// which the launcher image would carry. QEMU runs as QEMUUser, who cannot reach them where
	// they are (under /root).
	Shares map[string]string
	// Cgroup, when set, is the launcher's memory cgroup: the daemon starts in it, and the QEMU it
	// starts stays there (libvirt's own cgroups are off, as in KubeVirt's launcher).
	Cgroup *MemoryCgroup
	cmd    *exec.Cmd
	done   chan struct{}
}

// libvirtPaths are the fixed paths of libvirt's privileged driver, and the launcher's directory
// of KubeVirt's (kubevirt-private: the claims' images, the VNC and console sockets), each bound to
// a directory of the daemon's.
var libvirtPaths = map[string]string{"etc": "/etc/libvirt", "run": "/run/libvirt", "lib": "/var/lib/libvirt", "log": "/var/log/libvirt", "cache": "/var/cache/libvirt",
	"kubevirt-private": "/run/kubevirt-private"}

// HostPath is where a path of the daemon's mount namespace is on the host ("" where it is not in
// one of the daemon's directories).
func (d *Libvirtd) HostPath(path string) string {
	path = filepath.Clean(strings.Replace(path, "/var/run/", "/run/", 1))
	for sub, mount := range libvirtPaths {
		if rel, err := filepath.Rel(mount, path); err == nil && !strings.HasPrefix(rel, "..") {
			return filepath.Join(d.Dir, sub, rel)
		}
	}
	return ""
}

// Link makes path, in the daemon's mount namespace, a symbolic link to target (a host path that
// its QEMU sees too: the namespace binds only the daemon's directories).
func (d *Libvirtd) Link(path, target string) error {
	host := d.HostPath(path)
	if host == "" {
		return fmt.Errorf("%s is in none of the daemon's directories", path)
	}
	if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
		return err
	}
	_ = os.Remove(host)
	return os.Symlink(target, host)
}

// QEMUUser is the user KubeVirt's launcher runs QEMU as (its non-root default, "qemu").
var QEMUUser = relay.Owner{UID: 107, GID: 107}

// StartLibvirtd configures a daemon in dir (short: its socket's path must stay under 108 bytes)
// and starts it in the network namespace netns, with shares bound in its mount namespace.
func StartLibvirtd(dir, netns string, shares map[string]string, cgroup *MemoryCgroup) (*Libvirtd, error) {
	d := &Libvirtd{Dir: dir, NetNS: netns, Sock: filepath.Join(dir, "run", "libvirt-sock"), Shares: shares, Cgroup: cgroup}
	for sub, path := range libvirtPaths {
		// As a libvirt install has them: QEMUUser passes through to the daemon's per-driver
		// directories, which the daemon gives it; kubevirt-private is an emptyDir of the launcher
		// pod, which the launcher (as QEMUUser) writes.
		mode := os.FileMode(0o755)
		switch sub {
		case "etc":
			mode = 0o700
		case "kubevirt-private":
			mode = 0o777
		}
		if err := os.MkdirAll(filepath.Join(dir, sub), mode); err != nil {
			return nil, err
		}
		if err := os.Chmod(filepath.Join(dir, sub), mode); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(path, 0o755); err != nil { // the mount point, left empty on the host
			return nil, err
		}
	}
	for path := range shares {
		if err := os.MkdirAll(path, 0o755); err != nil { // the mount point, left empty on the host
			return nil, err
		}
	}
	// No polkit, no TCP. QEMU runs as KubeVirt's launcher runs it: as QEMUUser, with libvirt's
	// DAC driver giving it the files libvirt knows of (KubeVirt's qemu.conf: dynamic ownership,
	// no owner remembered), in the daemon's namespaces (it opens the node's tap itself, as
	// KubeVirt's launcher has no cgroups or namespaces of libvirt's), its console in files (there is
	// no virtlogd, which KubeVirt runs).
	conf := fmt.Sprintf(`unix_sock_dir = %q
unix_sock_rw_perms = "0700"
auth_unix_ro = "none"
auth_unix_rw = "none"
listen_tcp = 0
listen_tls = 0
log_outputs = "3:file:%s"
`, filepath.Join(dir, "run"), filepath.Join(dir, "log", "libvirtd.log"))
	qemuConf := fmt.Sprintf(`user = "+%d"
group = "+%d"
dynamic_ownership = 1
remember_owner = 0
cgroup_controllers = [ ]
namespaces = [ ]
stdio_handler = "file"
`, QEMUUser.UID, QEMUUser.GID)
	for name, text := range map[string]string{"libvirtd.conf": conf, "qemu.conf": qemuConf} {
		if err := os.WriteFile(filepath.Join(dir, "etc", name), []byte(text), 0o600); err != nil {
			return nil, err
		}
	}
	return d, d.Start()
}

// Start runs the daemon and waits until it answers. It is pinned to the first CPU: libvirt keys
// its cache of QEMU's capabilities on the CPU's CPUID, which differs between this machine's two
// CPUs, and would probe QEMU again (4 s) whenever it ran on the other one. QEMU itself runs on
// both. (ip netns exec gives the daemon a mount namespace of its own, so its binds stay there.)
func (d *Libvirtd) Start() error {
	binds := []string{}
	for sub, path := range libvirtPaths {
		binds = append(binds, fmt.Sprintf("mount --bind %s %s", filepath.Join(d.Dir, sub), path))
	}
	for path, host := range d.Shares {
		binds = append(binds, fmt.Sprintf("mount --bind %s %s && mount -o remount,bind,ro %s", host, path, path))
	}
	// The launcher pod's /dev, as a container runtime makes it: the usual nodes, /dev/net/tun
	// (KubeVirt's device plugin) and no /dev/kvm, as on a KubeVirt node without KVM. (This
	// machine's /dev/kvm, which QEMUUser cannot open, made libvirt find its capabilities of QEMU
	// outdated at every look: "KVM was enabled when probing ..., but it is not available now".)
	dev := filepath.Join(d.Dir, "dev")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		return err
	}
	binds = append(binds, "mount -t tmpfs -o mode=0755 launcher-dev "+dev)
	for _, n := range []string{"null", "zero", "full", "random", "urandom", "tty", "ptmx", "net/tun"} {
		node := filepath.Join(dev, n)
		binds = append(binds, fmt.Sprintf("mkdir -p %s && touch %s && mount --bind /dev/%s %s", filepath.Dir(node), node, n, node))
	}
	binds = append(binds, fmt.Sprintf("mkdir %s/pts && mount --bind /dev/pts %s/pts && mount --move %s /dev", dev, dev, dev))
	_ = os.Remove(d.Sock)
	args := []string{"taskset", "-c", "0", "ip", "netns", "exec", d.NetNS, "sh", "-c",
		strings.Join(binds, " && ") + " && exec /usr/sbin/libvirtd -f " + filepath.Join(d.Dir, "etc", "libvirtd.conf") + " -p " + filepath.Join(d.Dir, "run", "libvirtd.pid")}
	if d.Cgroup != nil { // entered before ip netns exec, which mounts a /sys of the namespace's without the cgroups
		args = append([]string{"sh", "-c", `echo $$ >"$0" && exec "$@"`, d.Cgroup.Procs()}, args...)
	}
	d.cmd = exec.Command(args[0], args[1:]...)
	logf, err := os.OpenFile(filepath.Join(d.Dir, "log", "libvirtd.stdout"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		_ = logf.Close()
		return err
	}
	d.done = make(chan struct{})
	go func() { _ = d.cmd.Wait(); _ = logf.Close(); close(d.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := d.Virsh("list", "--all"); err == nil {
			return nil
		}
		select {
		case <-d.done:
			return fmt.Errorf("libvirtd exited: %s", d.LogTail())
		default:
		}
		if time.Now().After(deadline) {
			d.Kill()
			return fmt.Errorf("libvirtd did not answer within 30s: %s", d.LogTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// LogTail is the end of the daemon's log.
func (d *Libvirtd) LogTail() string {
	return Tail(filepath.Join(d.Dir, "log", "libvirtd.log"))
}

// Kill ends the daemon as a crash would (SIGKILL); its domains' QEMUs run on.
func (d *Libvirtd) Kill() {
	if d.cmd != nil && d.cmd.Process != nil {
		_ = d.cmd.Process.Kill()
		<-d.done
	}
}

// Restart kills the daemon and starts it again on the same state.
func (d *Libvirtd) Restart() error {
	d.Kill()
	return d.Start()
}

// URI is the daemon's connection URI.
func (d *Libvirtd) URI() string { return "qemu+unix:///system?socket=" + d.Sock }

// Virsh runs virsh against the daemon.
func (d *Libvirtd) Virsh(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "virsh", append([]string{"-c", d.URI()}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("virsh %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// Define defines the domain (kept in file) and returns libvirt's inactive XML of it, as
// virt-launcher reads a domain back (GetXMLDesc with VIR_DOMAIN_XML_INACTIVE).
func (d *Libvirtd) Define(file string, domain []byte) ([]byte, error) {
	if err := os.WriteFile(file, domain, 0o600); err != nil {
		return nil, err
	}
	if _, err := d.Virsh("define", file); err != nil {
		return nil, err
	}
	var dom struct {
		Name string `xml:"name"`
	}
	if err := xml.Unmarshal(domain, &dom); err != nil {
		return nil, err
	}
	out, err := d.Virsh("dumpxml", "--inactive", dom.Name)
	return []byte(out), err
}

// DomainPID is the pid of the QEMU of the daemon's domain name.
func (d *Libvirtd) DomainPID(name string) (int, error) {
	b, err := os.ReadFile(filepath.Join(d.Dir, "run", "qemu", name+".pid"))
	if err != nil {
		return 0, err
	}
	var pid int
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &pid); err != nil || pid <= 0 {
		return 0, errors.Join(errors.New("the domain's pid file holds no pid"), err)
	}
	return pid, nil
}

// Tail is the end of a file (for logs in errors).
func Tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}
