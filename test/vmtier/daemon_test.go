//go:build linux && vmtier

package vmtier

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	virtv1 "kubevirt.io/api/core/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/colo"
	"github.com/lockstep-dev/lockstep/internal/lockstepd"
	"github.com/lockstep-dev/lockstep/internal/testnet"
	"github.com/lockstep-dev/lockstep/test/apitest"
)

// TestLockstepdProtectsTheMembersItFinds runs the lockstepd that users install (cmd/lockstepd,
// built here, with no engine flag: COLO is its default), one process per node namespace, against
// a real kube-apiserver. The test plays KubeVirt: it creates the member VMIs, running on their
// nodes, and launches each one's QEMU as a launcher would, in the VMI's directory under
// --run-dir. Nothing else tells lockstepd what to do. It must find the members, attach to their
// QEMUs, protect the VM (reporting status.replication and marking the secondary synchronized)
// over the logging interface alone; when that interface is cut on the secondary's node, decide
// the pair over the record (one side goes on, the other is fenced and its VMI deleted); protect
// again with a new secondary; and, when the primary's QEMU is killed, make the secondary go live
// on its own decision and move the pair's record to it. A third node's lockstepd is refused by
// both members.
func TestLockstepdProtectsTheMembersItFinds(t *testing.T) {
	c := newClusterOf(t, 3, false)
	env, cfg, k8s, err := apitest.Start(root)
	if err != nil {
		t.Fatalf("start envtest (make envtest-assets test-crds): %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	bin := filepath.Join(c.dir, "lockstepd")
	build := exec.Command("go", "build", "-o", bin, "./cmd/lockstepd")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building cmd/lockstepd: %v\n%s", err, out)
	}
	ns := "vmtier"
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	guest := resource.MustParse("256Mi")
	if err := k8s.Create(ctx, &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm"}, Spec: ftv1.FaultTolerantVMSpec{
		LoggingNetwork: ftv1.LoggingNetwork{Name: "ft-logging"},
		Template: ftv1.VMITemplate{Spec: virtv1.VirtualMachineInstanceSpec{Domain: virtv1.DomainSpec{
			CPU: &virtv1.CPU{Cores: 1}, Memory: &virtv1.Memory{Guest: &guest}}}},
	}}); err != nil {
		t.Fatal(err)
	}
	// As installed: lockstepd's RBAC and admission policy, the operator's signer, and on each
	// node a lockstepd pod's bound token.
	apitest.InstallIdentities(t, k8s, root)
	caPEM := apitest.StartSigner(t, cfg, k8s)
	for _, n := range c.nodes {
		if err := k8s.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}); err != nil {
			t.Fatal(err)
		}
		token, _ := apitest.LockstepdPod(t, cfg, k8s, n.name)
		c.runLockstepd(n, bin, cfg, token, caPEM)
	}

	// The primary, on node a: its VMI runs there, and its launcher starts QEMU.
	p := c.memberVMI(k8s, ns, "vm-1", ftv1.RolePrimary, c.nodes[0])
	c.attach(c.nodes[0])
	cl := &client{c: c}
	cl.next("the guest boots on the primary", 3*time.Minute)
	s := c.memberVMI(k8s, ns, "vm-2", ftv1.RoleSecondary, c.nodes[1])

	var ftvm ftv1.FaultTolerantVM
	report := func() *ftv1.ReplicationStatus {
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "vm"}, &ftvm); err != nil {
			return nil
		}
		return ftvm.Status.Replication
	}
	waitAPI(t, c, "lockstepd reports the pair Protected, the secondary synchronized", 3*time.Minute, func() bool {
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "vm"}, &ftvm); err != nil {
			return false
		}
		r := ftvm.Status.Replication
		return r != nil && r.Primary != nil && r.Primary.VMI == p.name && r.Primary.State == ftv1.SideProtected &&
			r.Secondary != nil && r.Secondary.VMI == s.name && r.Secondary.Synchronized
	})
	var vmi virtv1.VirtualMachineInstance
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: s.name}, &vmi); err != nil || vmi.Annotations[ftv1.AnnotationSyncedAt] == "" {
		t.Fatalf("lockstepd did not mark the secondary synchronized: %v %v", vmi.Annotations, err)
	}
	// lockstepd put the primary's disk size, as its QEMU opened it, on the primary's VMI: the
	// operator sizes the next secondary from it.
	waitAPI(t, c, "lockstepd publishes the primary's disk sizes", time.Minute, func() bool {
		return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: p.name}, &vmi) == nil &&
			vmi.Annotations[ftv1.AnnotationMeasuredDiskBytes] == fmt.Sprintf("rootdisk=%d", int64(diskSize))
	})
	for range 5 {
		cl.next("the primary serves under COLO", time.Minute)
	}
	// A third node's lockstepd, whose certificate the same CA signed, is refused by both
	// members: its streams into either side's QEMU (the secondary's disk replica, the primary's
	// packet comparison) and its FT log to the secondary, and each refusal is counted.
	in := c.intruder(c.nodes[2])
	refusedP, refusedS := c.refused(p.node), c.refused(s.node)
	if in.stream(s, colo.StreamNBD) || in.stream(p, colo.StreamCompare) || in.log(s.node) {
		t.Fatal("a third node's lockstepd reached the pair")
	}
	if c.refused(p.node) <= refusedP || c.refused(s.node) < refusedS+2 {
		t.Fatalf("the refusals were not counted: primary's node %v → %v, secondary's %v → %v", refusedP, c.refused(p.node), refusedS, c.refused(s.node))
	}
	cl.next("the primary serves under COLO after the third node was refused", time.Minute)
	// The streams and the FT log use the logging interface and no other: under load, lg carries
	// the checkpoints while host0, the node's own network (and its default route), carries
	// nothing; cutting host0 on both nodes changes nothing for the pair.
	lgBefore, hostBefore := p.node.txBytes(t, "lg"), p.node.txBytes(t, "host0")+s.node.txBytes(t, "host0")
	cl.serveFor("the primary serves under COLO", 3*time.Second)
	lg, host := p.node.txBytes(t, "lg")-lgBefore, p.node.txBytes(t, "host0")+s.node.txBytes(t, "host0")-hostBefore
	t.Logf("under load for 3s, the primary's node sent %d bytes on the logging interface and the two nodes %d on their own network", lg, host)
	if lg < 100_000 || host > 0 {
		t.Fatalf("the pair's traffic is not on the logging interface alone: lg %d bytes, host0 %d bytes", lg, host)
	}
	for _, n := range c.nodes[:2] {
		ip(t, "-n", n.ns, "link", "set", "host0", "down")
	}
	cl.serveFor("the primary serves with the nodes' own network cut", 3*time.Second)
	if r := report(); r == nil || r.Primary == nil || r.Primary.VMI != p.name || r.Primary.State != ftv1.SideProtected {
		t.Fatalf("cutting the nodes' own network disturbed the pair: %+v", r)
	}
	for _, n := range c.nodes[:2] {
		ip(t, "-n", n.ns, "link", "set", "host0", "up")
	}
	waitAPI(t, c, "lockstepd reports the checkpoint interval, pause and rate", time.Minute, func() bool {
		if k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "vm"}, &ftvm) != nil {
			return false
		}
		cps := ftvm.Status.Checkpoints
		return ftvm.Status.VLockstepInterval != nil && ftvm.Status.VLockstepInterval.Duration > 0 &&
			cps != nil && cps.PauseMilliseconds != nil && *cps.PauseMilliseconds > 0 && cps.PerSecond != nil && cps.PerSecond.MilliValue() > 0 && cps.ForcedPerSecond != nil &&
			cps.MismatchPerSecond != nil && cps.TimeoutPerSecond != nil // lockstep's QEMU counts the causes
	})
	cps := ftvm.Status.Checkpoints
	t.Logf("protected by the installed lockstepd: interval %s, log bandwidth %v, checkpoints %s a second (%s forced: %s on a mismatch, %s on a timeout), pause %d ms",
		ftvm.Status.VLockstepInterval.Duration, ftvm.Status.LogBandwidth, cps.PerSecond, cps.ForcedPerSecond, cps.MismatchPerSecond, cps.TimeoutPerSecond, *cps.PauseMilliseconds)

	// Cut the logging interface of the secondary's node, the node's own network up: the pair
	// notices (its traffic does not move to host0), one side goes on and the other is fenced.
	ip(t, "-n", s.node.ns, "link", "set", "lg", "down")
	var winner, loser *member
	waitAPI(t, c, "one side goes on after the logging interface was cut", time.Minute, func() bool {
		r := report()
		switch {
		case r == nil || r.Primary == nil || r.Primary.State != ftv1.SideAlone:
			return false
		case r.Primary.VMI == p.name:
			winner, loser = p, s
		case r.Primary.VMI == s.name:
			winner, loser = s, p
		default:
			return false
		}
		return true
	})
	c.attach(winner.node) // the test's switch stands in for the L2 network's learning
	waitAPI(t, c, "the fenced side's QEMU stops and lockstepd deletes its VMI", time.Minute, func() bool {
		return !loser.running() && apierrors.IsNotFound(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: loser.name}, &virtv1.VirtualMachineInstance{}))
	})
	cl.next("the side that went on serves", time.Minute)
	t.Logf("with the secondary's logging interface cut, %s went on and %s was fenced", winner.name, loser.name)
	ip(t, "-n", s.node.ns, "link", "set", "lg", "up")
	if winner == s {
		// What the operator does when it follows the record: the member that went live is
		// labelled primary (a new secondary's lockstepd streams to the pair's primary).
		var v virtv1.VirtualMachineInstance
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: s.name}, &v); err != nil {
			t.Fatal(err)
		}
		base := v.DeepCopy()
		v.Labels[ftv1.LabelRole] = ftv1.RolePrimary
		if err := k8s.Patch(ctx, &v, ctrlclient.MergeFrom(base)); err != nil {
			t.Fatal(err)
		}
	}

	// Protected again by a new secondary, then kill -9 of the primary's QEMU: the secondary goes
	// live on lockstepd's own decision, the record moves to it.
	s2 := c.memberVMI(k8s, ns, "vm-3", ftv1.RoleSecondary, c.nodes[2])
	waitAPI(t, c, "protected again by the new secondary", 3*time.Minute, func() bool {
		r := report()
		return r != nil && r.Primary != nil && r.Primary.VMI == winner.name && r.Primary.State == ftv1.SideProtected &&
			r.Secondary != nil && r.Secondary.VMI == s2.name && r.Secondary.Synchronized
	})
	for range 3 {
		cl.next("the VM serves under COLO again", time.Minute)
	}
	killed := time.Now()
	winner.killQEMU()
	waitAPI(t, c, "lockstepd reports the secondary live", time.Minute, func() bool {
		r := report()
		return r != nil && r.Primary != nil && r.Primary.VMI == s2.name && r.Primary.State == ftv1.SideAlone
	})
	c.attach(s2.node)
	at := cl.next("the secondary serves after kill -9 of the primary QEMU", time.Minute)
	t.Logf("kill -9 of the primary QEMU to the first reply of the live secondary, through the installed lockstepd and the test's switch: %s", at.Sub(killed).Round(time.Millisecond))
	cl.serveFor("the live secondary serves", 10*time.Second)
	cl.checkDisk(s2)

	var lease coordinationv1.Lease
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: ftv1.RecordName("vm")}, &lease); err != nil {
		t.Fatal(err)
	}
	if h := ptrString(lease.Spec.HolderIdentity); h != ftv1.SideIdentity(s2.node.name, s2.name) {
		t.Fatalf("the pair's record names %q, want the live secondary", h)
	}
	waitAPI(t, c, "lockstepd deletes the fenced primary's VMI", time.Minute, func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: winner.name}, &virtv1.VirtualMachineInstance{}))
	})
}

func ptrString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// runLockstepd runs the installed lockstepd in the node's namespace, as its DaemonSet would: the
// token of its pod, the API server through a forwarder into the namespace, the CA's certificate
// (as the kubelet mounts the operator's ConfigMap), the logging addresses of the node, the
// members' run directory. It requests its own certificate from the signer. No --engine: the
// default is COLO.
func (c *cluster) runLockstepd(n *node, bin string, cfg *rest.Config, token string, caPEM []byte) {
	t := c.t
	apiFwd, _ := testnet.Forward(t, n.ns, "127.0.0.1:6443", "", strings.TrimSuffix(strings.TrimPrefix(cfg.Host, "https://"), "/"))
	kubeconfig := apitest.WriteKubeconfigAs(t, cfg, c.dir, n.name, apiFwd, token)
	tlsDir := n.tlsDir(c)
	if err := os.MkdirAll(tlsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tlsDir, "ca.crt"), caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	period, compare := c.colo()
	args := []string{"netns", "exec", n.ns, bin,
		// Only the logging interface: lockstepd binds its listeners there and advertises its address.
		"--node-name", n.name, "--logging-interface", "lg", "--listen-address", ":7000", "--stream-listen-address", ":7001",
		"--run-dir", c.runDir,
		"--tls-cert-file", filepath.Join(tlsDir, "tls.crt"), "--tls-key-file", filepath.Join(tlsDir, "tls.key"), "--tls-ca-file", filepath.Join(tlsDir, "ca.crt"),
		"--heartbeat", heartbeat.String(), "--timeout", timeout.String(), "--detect", detect.String(), "--claim-timeout", "2s",
		"--status-interval", "500ms", "--metrics-bind-address", "127.0.0.1:9410", "--health-probe-bind-address", "127.0.0.1:9411",
		"--colo-checkpoint", period.String(), "--colo-compare-timeout", compare.String(), "--colo-ram-ahead=" + strconv.FormatBool(ramAhead),
	}
	cmd := exec.Command("ip", args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	logf, err := os.Create(filepath.Join(c.dir, n.name+"-lockstepd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logf.Close()
		b, _ := os.ReadFile(logf.Name())
		// Its RBAC and the admission policy allow everything lockstepd does for its own node.
		for _, refusal := range []string{"is forbidden", "denied request"} {
			if bytes.Contains(b, []byte(refusal)) {
				t.Errorf("the API server refused a write of %s's lockstepd (%q)", n.name, refusal)
			}
		}
		if t.Failed() {
			t.Logf("--- lockstepd on %s:\n%s", n.name, tail(b))
		}
	})
}

// memberVMI creates a member VMI that runs on node n, as KubeVirt reports it once its launcher
// pod runs, and launches its QEMU in the member's directory, which lockstepd names by the VMI's
// UID (lockstepd.MemberOf, the daemon's own mapping).
func (c *cluster) memberVMI(k8s ctrlclient.Client, ns, name, role string, n *node) *member {
	c.t.Helper()
	vmi := &virtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			ftv1.LabelPair: "vm", ftv1.LabelRole: role, ftv1.LabelNode: n.name},
			Annotations: map[string]string{ftv1.AnnotationReplicatedDisk: "rootdisk"}},
		Status: virtv1.VirtualMachineInstanceStatus{Phase: virtv1.Running, NodeName: n.name},
	}
	if err := k8s.Create(context.Background(), vmi); err != nil {
		c.t.Fatal(err)
	}
	spec := lockstepd.MemberOf(vmi, n.name)
	layout := lockstepd.Config{RunDir: c.runDir} // the run directory the lockstepd processes have
	m := &member{name: name, node: n, spec: spec, dir: layout.MemberDir(spec), exited: make(chan struct{})}
	c.launch(m)
	c.members = append(c.members, m)
	return m
}

// waitAPI polls ok until it holds, or fails the test after within.
func waitAPI(t *testing.T, c *cluster, what string, within time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			c.dump()
			t.Fatalf("timed out after %s waiting for: %s", within, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
