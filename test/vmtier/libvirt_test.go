//go:build linux && vmtier

package vmtier

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	"libvirt.org/go/libvirtxml"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/failover"
	"github.com/lockstep-dev/lockstep/internal/kubevirthook/api/info"
	"github.com/lockstep-dev/lockstep/internal/kubevirthook/api/v1alpha3"
)

// The libvirt stack: each member is launched as KubeVirt's virt-launcher launches a VMI, with
// the test playing virt-launcher. It builds the member's domain in KubeVirt's shape, sends it
// through the member's hook sidecar (the built cmd/lockstep-kubevirt-hook, over its own socket
// and gRPC), and defines and starts the result in the member's own libvirt daemon (Debian's
// libvirtd, hack/libvirt.sh), run in the member's node namespace as each virt-launcher pod runs
// its own; lockstepd then attaches to the QEMU that libvirt started.

// libvirtd is one member's libvirt daemon. It runs in the node's network namespace with its own
// mount namespace, in which the member's directories are bound over libvirt's fixed paths, so
// that several daemons run side by side.
type libvirtd struct {
	t    testing.TB
	dir  string
	ns   string // the node's network namespace
	sock string
	cmd  *exec.Cmd
	done chan struct{}
}

// libvirtPaths are the fixed paths of libvirt's privileged driver, each bound to a directory of
// the member's.
var libvirtPaths = map[string]string{"etc": "/etc/libvirt", "run": "/run/libvirt", "lib": "/var/lib/libvirt", "log": "/var/log/libvirt", "cache": "/var/cache/libvirt"}

// startLibvirtd starts a libvirt daemon for member m in its node's namespace.
func (c *cluster) startLibvirtd(m *member) *libvirtd {
	t := c.t
	dir, err := os.MkdirTemp("", "lv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	d := &libvirtd{t: t, dir: dir, ns: m.node.ns, sock: filepath.Join(dir, "run", "libvirt-sock")}
	for sub, path := range libvirtPaths {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(path, 0o755); err != nil { // the mount point, left empty on the host
			t.Fatal(err)
		}
	}
	// No polkit, no TCP; QEMU as root (the project's QEMU is under /root/.cache), in the
	// daemon's namespaces (it opens the node's tap itself), its console in files (no virtlogd).
	write(t, filepath.Join(dir, "etc", "libvirtd.conf"), fmt.Sprintf(`unix_sock_dir = %q
unix_sock_rw_perms = "0700"
auth_unix_ro = "none"
auth_unix_rw = "none"
listen_tcp = 0
listen_tls = 0
log_outputs = "3:file:%s"
`, filepath.Join(dir, "run"), filepath.Join(dir, "log", "libvirtd.log")))
	write(t, filepath.Join(dir, "etc", "qemu.conf"), `user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
seccomp_sandbox = 0
stdio_handler = "file"
clear_emulator_capabilities = 0
`)
	t.Cleanup(d.kill) // the daemon that runs then, after any restart
	d.start()
	return d
}

func write(t testing.TB, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// start runs the daemon. It is pinned to the first CPU: libvirt keys its cache of QEMU's
// capabilities on the CPU's CPUID, which differs between this machine's two CPUs, and would
// probe QEMU again (4 s) whenever it ran on the other one. QEMU itself runs on both.
func (d *libvirtd) start() {
	binds := []string{}
	for sub, path := range libvirtPaths {
		binds = append(binds, fmt.Sprintf("mount --bind %s %s", filepath.Join(d.dir, sub), path))
	}
	_ = os.Remove(d.sock)
	d.cmd = exec.Command("taskset", "-c", "0", "ip", "netns", "exec", d.ns, "sh", "-c",
		strings.Join(binds, " && ")+" && exec /usr/sbin/libvirtd -f "+filepath.Join(d.dir, "etc", "libvirtd.conf")+" -p "+filepath.Join(d.dir, "run", "libvirtd.pid"))
	logf, err := os.OpenFile(filepath.Join(d.dir, "log", "libvirtd.stdout"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		d.t.Fatal(err)
	}
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.done = make(chan struct{})
	go func() { _ = d.cmd.Wait(); _ = logf.Close(); close(d.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := d.virsh("list", "--all"); err == nil {
			return
		}
		select {
		case <-d.done:
			d.t.Fatalf("libvirtd exited: %s", tail(readFile(filepath.Join(d.dir, "log", "libvirtd.log"))))
		default:
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("libvirtd did not answer within 30s: %s", tail(readFile(filepath.Join(d.dir, "log", "libvirtd.log"))))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func readFile(p string) []byte { b, _ := os.ReadFile(p); return b }

// kill ends the daemon as a crash would (SIGKILL); its domains' QEMUs run on.
func (d *libvirtd) kill() {
	if d.cmd != nil && d.cmd.Process != nil {
		_ = d.cmd.Process.Kill()
		<-d.done
	}
}

// restart kills the daemon and starts it again on the same state.
func (d *libvirtd) restart() {
	d.kill()
	d.start()
}

// virsh runs virsh against the daemon.
func (d *libvirtd) virsh(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "virsh", append([]string{"-c", "qemu+unix:///system?socket=" + d.sock}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("virsh %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

func (d *libvirtd) must(args ...string) string {
	d.t.Helper()
	out, err := d.virsh(args...)
	if err != nil {
		d.t.Fatal(err)
	}
	return out
}

// domainName is the member's domain, named as KubeVirt names it: <namespace>_<vmi>.
func domainName(m *member) string { return "vmtier_" + m.name }

// launchLibvirt launches the member as virt-launcher would, through its hook sidecar and its own
// libvirt daemon.
func (c *cluster) launchLibvirt(m *member) {
	t := c.t
	file := func(f string) string { return filepath.Join(m.dir, f) }
	hook := c.startHook(m)
	// virt-launcher's handshake: the hook's name, hook points and versions.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+hook, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	var res *info.InfoResult
	for {
		if res, err = info.NewInfoClient(conn).Info(ctx, &info.InfoParams{}); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || len(res.HookPoints) != 1 || res.HookPoints[0].Name != "OnDefineDomain" || res.Versions[0] != "v1alpha3" {
		t.Fatalf("the hook's handshake: %v %v", res, err)
	}
	disk := file("disk.qcow2")
	if !m.spec.Primary {
		disk = file("parent.qcow2") // the secondary's copy of the disk, which protection resyncs
	}
	domain, err := kubevirtDomain(c, m, disk, file("active.qcow2"), file("hidden.qcow2")).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	out, err := v1alpha3.NewCallbacksClient(conn).OnDefineDomain(ctx, &v1alpha3.OnDefineDomainParams{DomainXML: []byte(domain), Vmi: memberVMIJSON(t, m)})
	if err != nil {
		t.Fatalf("OnDefineDomain: %v", err)
	}
	write(t, file("domain.xml"), string(out.DomainXML))

	m.lv = c.startLibvirtd(m)
	m.lv.must("define", file("domain.xml"))
	start := []string{"start", domainName(m)}
	if !m.spec.Primary {
		// The secondary's VMI has startStrategy Paused: it waits for its primary's state, and
		// libvirt must not resume it (a daemon restart would kill a domain still "starting up").
		start = append(start, "--paused")
	}
	m.lv.must(start...)
	pid, err := strconv.Atoi(strings.TrimSpace(string(readFile(filepath.Join(m.lv.dir, "run", "qemu", domainName(m)+".pid")))))
	if err != nil {
		t.Fatalf("the QEMU's pid: %v", err)
	}
	m.pid = pid
	go func() {
		for syscall.Kill(pid, 0) == nil {
			time.Sleep(20 * time.Millisecond)
		}
		close(m.exited)
	}()
}

// startHook runs the member's hook sidecar (the built cmd/lockstep-kubevirt-hook) and returns its
// socket.
func (c *cluster) startHook(m *member) string {
	t := c.t
	if c.hookBin == "" {
		c.hookBin = filepath.Join(c.dir, "lockstep-kubevirt-hook")
		build := exec.Command("go", "build", "-o", c.hookBin, "./cmd/lockstep-kubevirt-hook")
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building cmd/lockstep-kubevirt-hook: %v\n%s", err, out)
		}
	}
	dir, err := os.MkdirTemp("", "hook")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "lockstep.sock")
	cmd := exec.Command(c.hookBin, "--sidecar-socket", sock, "--run-dir", c.runDir)
	logf, err := os.Create(filepath.Join(m.dir, "hook.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = logf.Close() })
	return sock
}

// kubevirtDomain is the member's domain as virt-launcher generates it for the member's VMI, in
// the parts the hook reads: the disks by alias (ua-<disk>: the VM's disk, and the two COLO
// overlays that every member VMI carries as emptyDisk volumes), the NIC on the pod's tap
// (ethernet, not managed by libvirt, alias ua-default), and the member's firmware UUID. Where the
// VM tier's guest needs it, it differs from KubeVirt's: the machine is pc with an rtl8139 NIC and
// the test guest's kernel, and the test adds its own monitor (the VM tier inspects the VM
// through it).
func kubevirtDomain(c *cluster, m *member, disk, active, hidden string) *libvirtxml.Domain {
	fileDisk := func(alias, path, dev string) libvirtxml.DomainDisk {
		return libvirtxml.DomainDisk{Device: "disk",
			Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "qcow2", Cache: "none"},
			Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: path}},
			Target: &libvirtxml.DomainDiskTarget{Dev: dev, Bus: "virtio"}, Alias: &libvirtxml.DomainAlias{Name: alias}}
	}
	args := []libvirtxml.DomainQEMUCommandlineArg{}
	for _, a := range append(append([]string{}, "-L", m.vm.Firmware[0], "-L", m.vm.Firmware[1]), "-qmp", "unix:"+m.vm.QMP+",server=on,wait=off") {
		args = append(args, libvirtxml.DomainQEMUCommandlineArg{Value: a})
	}
	return &libvirtxml.Domain{
		Type: "qemu", Name: domainName(m), UUID: "6d1a7f0e-2c84-5b43-9a6e-3f2b1c0d9e8a",
		Memory: &libvirtxml.DomainMemory{Value: uint(m.vm.MemoryMB), Unit: "MiB"},
		VCPU:   &libvirtxml.DomainVCPU{Value: 1},
		OS: &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Arch: "x86_64", Machine: "pc", Type: "hvm"},
			Kernel: m.vm.Kernel, Initrd: m.vm.Initrd, Cmdline: m.vm.Append},
		CPU:        &libvirtxml.DomainCPU{Mode: "custom", Match: "exact", Check: "none", Model: &libvirtxml.DomainCPUModel{Fallback: "forbid", Value: "qemu64"}},
		OnPoweroff: "destroy", OnReboot: "restart", OnCrash: "destroy",
		Devices: &libvirtxml.DomainDeviceList{
			Emulator:    filepath.Join(c.qemu, "bin", "qemu-system-x86_64"),
			Disks:       []libvirtxml.DomainDisk{fileDisk("ua-rootdisk", disk, "vda"), fileDisk("ua-"+ftv1.DiskColoActive, active, "vdb"), fileDisk("ua-"+ftv1.DiskColoHidden, hidden, "vdc")},
			Controllers: []libvirtxml.DomainController{{Type: "usb", Model: "none"}},
			Interfaces: []libvirtxml.DomainInterface{{
				Source: &libvirtxml.DomainInterfaceSource{Ethernet: &libvirtxml.DomainInterfaceSourceEthernet{}},
				Target: &libvirtxml.DomainInterfaceTarget{Dev: m.vm.Tap, Managed: "no"},
				Model:  &libvirtxml.DomainInterfaceModel{Type: "rtl8139"},
				MAC:    &libvirtxml.DomainInterfaceMAC{Address: m.vm.MAC},
				ROM:    &libvirtxml.DomainROM{Enabled: "no"},
				Alias:  &libvirtxml.DomainAlias{Name: "ua-default"},
			}},
			Serials:    []libvirtxml.DomainSerial{{Source: &libvirtxml.DomainChardevSource{File: &libvirtxml.DomainChardevSourceFile{Path: m.vm.Serial}}, Target: &libvirtxml.DomainSerialTarget{Port: new(uint)}}},
			Videos:     []libvirtxml.DomainVideo{{Model: libvirtxml.DomainVideoModel{Type: "none"}}},
			MemBalloon: &libvirtxml.DomainMemBalloon{Model: "none"},
		},
		QEMUCommandline: &libvirtxml.DomainQEMUCommandline{Args: args},
	}
}

// memberVMIJSON is the member's VMI as virt-launcher sends it to the hook: the pair and role
// labels and the UID that names its directory, and its disks.
func memberVMIJSON(t testing.TB, m *member) []byte {
	role := ftv1.RoleSecondary
	if m.spec.Primary {
		role = ftv1.RolePrimary
	}
	ns, pair, _ := strings.Cut(m.spec.Pair, "/")
	vmi := virtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: m.name, UID: types.UID(m.spec.UID), Labels: map[string]string{ftv1.LabelPair: pair, ftv1.LabelRole: role},
			Annotations: map[string]string{ftv1.AnnotationReplicatedDisk: "rootdisk"}}, // as the operator names it
		Spec: virtv1.VirtualMachineInstanceSpec{Domain: virtv1.DomainSpec{Devices: virtv1.Devices{Disks: []virtv1.Disk{
			{Name: "rootdisk"}, {Name: ftv1.DiskColoActive}, {Name: ftv1.DiskColoHidden},
		}}}},
	}
	b, err := json.Marshal(vmi)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The VM tier's scenarios on the libvirt stack, with the same checks: the counter never goes
// back, the boot stays the same, the disk holds the last acknowledged count, the loser is fenced.

func TestLibvirtFailoverOnKillOfThePrimaryQEMU(t *testing.T)     { failoverOnKill(t, viaLibvirt) }
func TestLibvirtFailoverOnLossOfThePrimaryNode(t *testing.T)     { failoverOnNodeLoss(t, viaLibvirt) }
func TestLibvirtReprotectionSurvivesASecondFailure(t *testing.T) { reprotection(t, viaLibvirt) }
func TestLibvirtPartitionLetsOneSideServe(t *testing.T)          { partition(t, viaLibvirt) }

// events follows the lifecycle events of the daemon's domains (virsh event --loop) until the
// test ends.
type events struct {
	mu    sync.Mutex
	lines []string
}

func (d *libvirtd) watch() *events {
	ev := &events{}
	cmd := exec.Command("virsh", "-c", "qemu+unix:///system?socket="+d.sock, "event", "--all", "--loop", "--timestamp")
	out, err := cmd.StdoutPipe()
	if err != nil {
		d.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "event 'lifecycle'") {
				ev.mu.Lock()
				ev.lines = append(ev.lines, sc.Text())
				ev.mu.Unlock()
			}
		}
	}()
	return ev
}

// count is the number of lifecycle events so far, and of those that name kind.
func (ev *events) count(kind string) (all, of int) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	for _, l := range ev.lines {
		if strings.Contains(l, kind) {
			of++
		}
	}
	return len(ev.lines), of
}

func (c *cluster) checkpointCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.checkpoints)
}

// state is the domain's state and reason in its daemon ("running (unpaused)").
func (m *member) state() string {
	out, err := m.lv.virsh("domstate", "--reason", domainName(m))
	if err != nil {
		return err.Error()
	}
	return out
}

// TestLibvirtHoldsACOLOMember is what libvirt does to a COLO member, and what it lets lockstep
// do: the lifecycle events each checkpoint causes in both members' daemons; a restart of both
// daemons during COLO, after which the pair stays protected and libvirt manages both domains
// again; and libvirt destroying the primary (what virt-launcher does when the primary's VMI is
// deleted), after which the secondary goes live with nothing lost, in a domain that its libvirt
// still manages.
func TestLibvirtHoldsACOLOMember(t *testing.T) {
	c, cl, p, s := protectedPair(t, 2, viaLibvirt)
	pe, se := p.lv.watch(), s.lv.watch()
	time.Sleep(time.Second) // the watchers are connected
	cp0 := c.checkpointCount()
	cl.serveFor("the primary serves under COLO, libvirt watching", 10*time.Second)
	cps := c.checkpointCount() - cp0
	pAll, pSusp := pe.count("Suspended")
	sAll, sSusp := se.count("Suspended")
	t.Logf("in 10 s under load, %d checkpoints; the primary's libvirt saw %d lifecycle events (%d Suspended), the secondary's %d (%d Suspended)", cps, pAll, pSusp, sAll, sSusp)
	if cps == 0 {
		t.Fatal("no checkpoint in 10 s")
	}
	running := func(m *member) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for st := m.state(); !strings.HasPrefix(st, "running"); st = m.state() {
			if time.Now().After(deadline) {
				t.Fatalf("libvirt reports %s's domain %q, want running", m.name, st)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	running(p)

	// Both daemons restart during COLO: the QEMUs run on, the pair stays protected, checkpoints
	// go on, and libvirt reconnects to both domains.
	p.lv.restart()
	s.lv.restart()
	cp1 := c.checkpointCount()
	for range 5 {
		cl.next("the primary serves under COLO after both libvirt daemons restarted", time.Minute)
	}
	c.waitState(p, failover.Protected, 10*time.Second)
	if c.checkpointCount() == cp1 {
		t.Fatal("no checkpoint after the daemons restarted")
	}
	running(p)
	t.Logf("after the restarts libvirt reports the primary %q and the secondary %q", p.state(), s.state())

	// libvirt destroys the primary: the secondary goes live, and its libvirt runs it.
	destroyed := time.Now()
	p.lv.must("destroy", domainName(p))
	t.Logf("virsh destroy of the primary took %s", time.Since(destroyed).Round(time.Millisecond))
	failedOver(t, c, cl, p, s, destroyed, "libvirt destroying the primary")
	running(s)
	if st := p.state(); !strings.HasPrefix(st, "shut off") {
		t.Fatalf("the destroyed primary's domain: %q", st)
	}
	t.Logf("after the failover libvirt reports the live secondary %q and the primary %q", s.state(), p.state())
	if _, err := s.lv.virsh("dominfo", domainName(s)); err != nil {
		t.Fatalf("libvirt no longer manages the live secondary: %v", err)
	}
}
