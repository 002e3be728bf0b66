package virtlauncher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
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
	cmd  *exec.Cmd
	done chan struct{}
}

// libvirtPaths are the fixed paths of libvirt's privileged driver, each bound to a directory of
// the daemon's.
var libvirtPaths = map[string]string{"etc": "/etc/libvirt", "run": "/run/libvirt", "lib": "/var/lib/libvirt", "log": "/var/log/libvirt", "cache": "/var/cache/libvirt"}

// StartLibvirtd configures a daemon in dir (short: its socket's path must stay under 108 bytes)
// and starts it in the network namespace netns.
func StartLibvirtd(dir, netns string) (*Libvirtd, error) {
	d := &Libvirtd{Dir: dir, NetNS: netns, Sock: filepath.Join(dir, "run", "libvirt-sock")}
	for sub, path := range libvirtPaths {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(path, 0o755); err != nil { // the mount point, left empty on the host
			return nil, err
		}
	}
	// No polkit, no TCP; QEMU as root (the project's QEMU is under /root/.cache), in the
	// daemon's namespaces (it opens the node's tap itself), its console in files (no virtlogd).
	conf := fmt.Sprintf(`unix_sock_dir = %q
unix_sock_rw_perms = "0700"
auth_unix_ro = "none"
auth_unix_rw = "none"
listen_tcp = 0
listen_tls = 0
log_outputs = "3:file:%s"
`, filepath.Join(dir, "run"), filepath.Join(dir, "log", "libvirtd.log"))
	qemuConf := `user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
seccomp_sandbox = 0
stdio_handler = "file"
clear_emulator_capabilities = 0
`
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
	_ = os.Remove(d.Sock)
	d.cmd = exec.Command("taskset", "-c", "0", "ip", "netns", "exec", d.NetNS, "sh", "-c",
		strings.Join(binds, " && ")+" && exec /usr/sbin/libvirtd -f "+filepath.Join(d.Dir, "etc", "libvirtd.conf")+" -p "+filepath.Join(d.Dir, "run", "libvirtd.pid"))
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
