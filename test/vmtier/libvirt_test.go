//go:build linux && vmtier

package vmtier

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/failover"
	"github.com/lockstep-dev/lockstep/test/virtlauncher"
)

// The libvirt stack: each member is launched as KubeVirt's virt-launcher launches a VMI, with
// the test playing virt-launcher through test/virtlauncher: the member's domain in KubeVirt's
// shape, sent through the member's hook sidecar (the built cmd/lockstep-kubevirt-hook, over its
// own socket and gRPC), and defined and started in the member's own libvirt daemon (Debian's
// libvirtd, hack/libvirt.sh), run in the member's node namespace as each virt-launcher pod runs
// its own; lockstepd then attaches to the QEMU that libvirt started.

// domainName is the member's domain, named as KubeVirt names it: <namespace>_<vmi>.
func domainName(m *member) string { return "vmtier_" + m.name }

// launchLibvirt launches the member as virt-launcher would, through its hook sidecar and its own
// libvirt daemon.
func (c *cluster) launchLibvirt(m *member) {
	t := c.t
	file := func(f string) string { return filepath.Join(m.dir, f) }
	if c.hookBin == "" {
		c.hookBin = filepath.Join(c.dir, "lockstep-kubevirt-hook")
		build := exec.Command("go", "build", "-o", c.hookBin, "./cmd/lockstep-kubevirt-hook")
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building cmd/lockstep-kubevirt-hook: %v\n%s", err, out)
		}
	}
	state, err := os.MkdirTemp("", "lv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(state) })
	disk := file("disk.qcow2")
	if !m.spec.Primary {
		disk = file("parent.qcow2") // the secondary's copy of the disk, which protection resyncs
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	extra := c.diagnostics(m, "hostua-default") // libvirt's netdev for the NIC of alias ua-default
	l, err := virtlauncher.Launch(ctx, virtlauncher.Member{
		VMI: memberVMI(m),
		Domain: virtlauncher.DomainSpec{Name: domainName(m), UUID: "6d1a7f0e-2c84-5b43-9a6e-3f2b1c0d9e8a",
			Emulator: filepath.Join(c.qemu, "bin", "qemu-system-x86_64"), VM: m.vm,
			ReplicatedDisk: "rootdisk", Disk: disk, Active: file("active.qcow2"), Hidden: file("hidden.qcow2"), Extra: extra},
		NetNS: m.node.ns, StateDir: state, HookBin: c.hookBin, RunDir: c.runDir, Log: m.dir,
		Paused: !m.spec.Primary,
	})
	if err != nil {
		t.Fatalf("%s: %v", m.name, err)
	}
	t.Cleanup(l.Stop) // the daemon and the hook that run then, after any restart
	m.lv, m.pid = l.Libvirtd, l.PID
	go func() { <-l.Exited; close(m.exited) }()
}

// memberVMI is the member's VMI as virt-launcher sends it to the hook: the pair and role labels
// and the UID that names its directory, and its disks.
func memberVMI(m *member) *virtv1.VirtualMachineInstance {
	role := ftv1.RoleSecondary
	if m.spec.Primary {
		role = ftv1.RolePrimary
	}
	ns, pair, _ := strings.Cut(m.spec.Pair, "/")
	return &virtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: m.name, UID: types.UID(m.spec.UID), Labels: map[string]string{ftv1.LabelPair: pair, ftv1.LabelRole: role},
			Annotations: map[string]string{ftv1.AnnotationReplicatedDisk: "rootdisk"}}, // as the operator names it
		Spec: virtv1.VirtualMachineInstanceSpec{Domain: virtv1.DomainSpec{Devices: virtv1.Devices{Disks: []virtv1.Disk{
			{Name: "rootdisk"}, {Name: ftv1.DiskColoActive}, {Name: ftv1.DiskColoHidden},
		}}}},
	}
}

// virsh runs virsh against the member's daemon and fails the test on an error.
func (m *member) virsh(t testing.TB, args ...string) string {
	t.Helper()
	out, err := m.lv.Virsh(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The VM tier's scenarios on the libvirt stack, with the same checks: the counter never goes
// back, the boot stays the same, the disk holds the last acknowledged count, the loser is fenced.

func TestLibvirtFailoverOnKillOfThePrimaryQEMU(t *testing.T)     { failoverOnKill(t, viaLibvirt) }
func TestLibvirtFailoverOnLossOfThePrimaryNode(t *testing.T)     { failoverOnNodeLoss(t, viaLibvirt) }
func TestLibvirtReprotectionSurvivesASecondFailure(t *testing.T) { reprotection(t, viaLibvirt) }
func TestLibvirtPartitionLetsOneSideServe(t *testing.T)          { partition(t, viaLibvirt) }
func TestLibvirtGoLiveSurvivesALockstepdCrash(t *testing.T) {
	goLiveSurvivesALockstepdCrash(t, viaLibvirt)
}

// events follows the lifecycle events of the daemon's domains (virsh event --loop) until the
// test ends.
type events struct {
	mu    sync.Mutex
	lines []string
}

func watch(t testing.TB, d *virtlauncher.Libvirtd) *events {
	ev := &events{}
	cmd := exec.Command("virsh", "-c", d.URI(), "event", "--all", "--loop", "--timestamp")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
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
	out, err := m.lv.Virsh("domstate", "--reason", domainName(m))
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
	pe, se := watch(t, p.lv), watch(t, s.lv)
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
	for _, m := range []*member{p, s} {
		if err := m.lv.Restart(); err != nil {
			t.Fatal(err)
		}
	}
	// A checkpoint comes on a mismatch or on the timer (x-checkpoint-delay), so the client asks
	// until one has, rather than for a fixed number of replies that may all match.
	cp1 := c.checkpointCount()
	for deadline := time.Now().Add(30 * time.Second); c.checkpointCount() == cp1; {
		if time.Now().After(deadline) {
			t.Fatal("no checkpoint in 30 s after the daemons restarted")
		}
		cl.next("the primary serves under COLO after both libvirt daemons restarted", time.Minute)
	}
	c.waitState(p, failover.Protected, 10*time.Second)
	running(p)
	t.Logf("after the restarts libvirt reports the primary %q and the secondary %q", p.state(), s.state())

	// libvirt destroys the primary: the secondary goes live, and its libvirt runs it.
	destroyed := time.Now()
	p.virsh(t, "destroy", domainName(p))
	t.Logf("virsh destroy of the primary took %s", time.Since(destroyed).Round(time.Millisecond))
	failedOver(t, c, cl, p, s, destroyed, "libvirt destroying the primary")
	running(s)
	if st := p.state(); !strings.HasPrefix(st, "shut off") {
		t.Fatalf("the destroyed primary's domain: %q", st)
	}
	t.Logf("after the failover libvirt reports the live secondary %q and the primary %q", s.state(), p.state())
	if _, err := s.lv.Virsh("dominfo", domainName(s)); err != nil {
		t.Fatalf("libvirt no longer manages the live secondary: %v", err)
	}
}
