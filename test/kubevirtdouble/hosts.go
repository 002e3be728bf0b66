package kubevirtdouble

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/lockstep-dev/lockstep/internal/testnet"
)

// Hosts is the TEST DOUBLE of the nodes' machines in the local cluster's full stack. kwok
// simulates a node's kubelet, not its machine; Hosts gives each node a host: a network namespace
// joined to a switch namespace by three links (the VM network, the logging network, the node's
// own network), and on it lockstepd as its DaemonSet runs it — the real binary, the DaemonSet's
// arguments, its pod's bound token, its certificate from the operator's signer — and the VMs that
// Domains boots there.
//
// The switch namespace, <cluster>_sw, has a bridge per network: brw (the VMs' L2 network; a
// client namespace, <cluster>_client, is on it at ClientAddress), brl (the logging network, each
// host's "ftlog" interface, the name the DaemonSet's --logging-interface gives) and brn (the
// nodes' own network, each host's default route).
//
// A node's host dies when its kwok Lease is taken by KilledHolder (hack/local-cluster.sh
// kill-node): its links, QEMUs, libvirt daemons and lockstepd die with its namespace. When the
// Lease is free again (revive-node) an empty host comes back. SilencedHolder stops only the
// node's heartbeat: the host runs on. CutHolder cuts the host from the control plane (cut-api): its
// heartbeat stops, its processes lose their path to the API server, and its kubelet sees nothing:
// the VMIs and pods deleted meanwhile keep running on the host, and nothing on it reports, until
// the Lease is free again (heal-api) and the kubelet catches up. A host's clock is off when its
// ClockSkewFile says so (skew-clock): its lockstepd, started again, runs on a wall clock that far
// off (hack/skewclock.sh); its other processes keep the machine's clock. A restart of the double
// reboots every host.
type Hosts struct {
	client.Client
	Clientset kubernetes.Interface
	// Config is the double's own connection; lockstepd reaches the same API server through a
	// forwarder on 127.0.0.1:6443 in its host.
	Config *rest.Config
	// Cluster prefixes the namespaces' names.
	Cluster string
	// StateDir holds each host's directories (short: Unix socket paths end at 107 bytes).
	StateDir string
	// Lockstepd is the lockstepd binary; LockstepdSkewClock is the same source built with its wall
	// clock skewed (hack/skewclock.sh), which a host whose clock is off runs (ClockSkewFile).
	Lockstepd, LockstepdSkewClock string
	// DaemonSet is lockstepd's DaemonSet, whose pods kwok runs on the nodes.
	DaemonSet types.NamespacedName
	Log       logr.Logger

	mu      sync.Mutex
	hosts   map[string]*Host
	used    map[int]bool
	restart chan event.GenericEvent // nodes whose lockstepd exited
}

// The holders of a node's kwok Lease that stand for the node's host dying, and for the node
// losing only its heartbeat to the API server.
const (
	KilledHolder   = "lockstep-killed-node"
	SilencedHolder = "lockstep-silenced-node"
	CutHolder      = "lockstep-cut-node"
)

// The networks' addresses. The VM network is 10.214.0.0/16: the client is 10.214.0.1, the VMs take
// theirs from their cloud-init network data. Host i is 10.215.0.i on the logging network and
// 10.216.0.i on its own.
const (
	ClientAddress = "10.214.0.1"
	vmPrefix      = 16
)

// Host is one node's machine.
type Host struct {
	Node  string
	NS    string
	Index int
	Dir   string
	// RunDir is the members' directory that lockstepd and the launchers share.
	RunDir string

	mu        sync.Mutex
	lockstepd *exec.Cmd
	// pod is the lockstepd pod the running lockstepd is (lockstepdpods.go); stopping: it is being
	// terminated, as the kubelet stops a deleted pod's container.
	pod       types.UID
	stopping  bool
	forwarder *forwarder
	dead      bool
	// cut: the host has no path to the API server (CutHolder); onHeal is what its kubelet does
	// once it has one again (the deletions it did not see).
	cut     bool
	onHeal  []func()
	domains map[types.UID]*domain
}

// NodeRunDir is lockstepd's --run-dir on a node of a real cluster, the members' directories,
// which config/kubevirt mounts into launcher pods as hostPaths under it.
const NodeRunDir = "/var/run/lockstep"

// OnHost is the directory of this host that stands for the node's path p: a member's directory
// under NodeRunDir is under RunDir (the double's hosts share one machine, so each has its own).
func (h *Host) OnHost(p string) (string, error) {
	rel, err := filepath.Rel(NodeRunDir, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("the double's hosts have no node path %s (only %s)", p, NodeRunDir)
	}
	return filepath.Join(h.RunDir, rel), nil
}

// SwitchNS and ClientNS are the shared namespaces' names.
func (h *Hosts) SwitchNS() string { return SwitchNS(h.Cluster) }
func (h *Hosts) ClientNS() string { return ClientNS(h.Cluster) }

// NodeNS is the namespace of node's host.
func (h *Hosts) NodeNS(node string) string { return NodeNS(h.Cluster, node) }

// The namespaces of a cluster's hosts: <cluster>_<name>. (Node and cluster names have no "_",
// so one cluster's prefix is never another's.)
func SwitchNS(cluster string) string     { return cluster + "_sw" }
func ClientNS(cluster string) string     { return cluster + "_client" }
func NodeNS(cluster, node string) string { return cluster + "_" + node }

// Setup makes the switch and the client, after removing what an earlier run left.
func (h *Hosts) Setup() error {
	h.hosts, h.used = map[string]*Host{}, map[int]bool{}
	if err := h.Teardown(); err != nil {
		return err
	}
	if err := os.MkdirAll(h.StateDir, 0o755); err != nil {
		return err
	}
	sw, cl := h.SwitchNS(), h.ClientNS()
	steps := [][]string{{"netns", "add", sw}, {"netns", "add", cl}}
	for _, br := range []string{"brw", "brl", "brn"} {
		steps = append(steps, []string{"-n", sw, "link", "add", br, "type", "bridge"}, []string{"-n", sw, "link", "set", br, "up"})
	}
	steps = append(steps,
		[]string{"-n", cl, "link", "add", "eth0", "type", "veth", "peer", "name", "client", "netns", sw},
		[]string{"-n", cl, "addr", "add", fmt.Sprintf("%s/%d", ClientAddress, vmPrefix), "dev", "eth0"},
		[]string{"-n", cl, "link", "set", "eth0", "up"},
		[]string{"-n", cl, "link", "set", "lo", "up"},
		[]string{"-n", sw, "link", "set", "client", "master", "brw"},
		[]string{"-n", sw, "link", "set", "client", "up"})
	return ipAll(steps)
}

// Teardown kills every process in the cluster's namespaces and removes them, and the hosts'
// directories.
func (h *Hosts) Teardown() error {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return fmt.Errorf("ip netns list: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if strings.HasPrefix(name, h.Cluster+"_") {
			killNS(name)
		}
	}
	// The hosts' directories go; the claims' images stay, as network storage would.
	entries, err := os.ReadDir(h.StateDir)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	for _, e := range entries {
		if e.Name() != "storage" && !strings.HasSuffix(e.Name(), ".log") {
			if err := os.RemoveAll(filepath.Join(h.StateDir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// killNS kills what runs in a namespace and removes it.
func killNS(ns string) {
	if pids, err := exec.Command("ip", "netns", "pids", ns).Output(); err == nil {
		for _, pid := range strings.Fields(string(pids)) {
			_ = exec.Command("kill", "-9", pid).Run()
		}
	}
	_ = exec.Command("ip", "netns", "delete", ns).Run()
}

// Host is node's live host, or nil.
func (h *Hosts) Host(node string) *Host {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ho := h.hosts[node]; ho != nil && !ho.isDead() {
		return ho
	}
	return nil
}

// Reconcile keeps a node's host in step with the node and its kwok Lease.
func (h *Hosts) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	name := req.Name
	node := &corev1.Node{}
	if err := h.Get(ctx, types.NamespacedName{Name: name}, node); err != nil {
		if apierrors.IsNotFound(err) {
			h.kill(name, "its node was deleted")
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	lease := &coordinationv1.Lease{}
	err := h.Get(ctx, types.NamespacedName{Namespace: corev1.NamespaceNodeLease, Name: name}, lease)
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	holder := ""
	if err == nil && lease.Spec.HolderIdentity != nil {
		holder = *lease.Spec.HolderIdentity
	}
	if holder == KilledHolder {
		h.kill(name, "hack/local-cluster.sh kill-node")
		return ctrl.Result{}, nil
	}
	ho, err := h.up(name)
	if err != nil {
		return ctrl.Result{}, err
	}
	if holder == CutHolder {
		h.cutAPI(ho)
		return ctrl.Result{}, nil // its kubelet sees no pod change, and starts nothing
	}
	if err := h.healAPI(ho); err != nil {
		return ctrl.Result{}, err
	}
	pod, err := h.tendLockstepdPods(ctx, ho)
	if err != nil || pod == nil || ho.lockstepdRunning() {
		return ctrl.Result{}, err
	}
	if err := h.startLockstepd(ctx, ho, pod); err != nil {
		h.Log.Info("lockstepd cannot start yet", "node", name, "why", err.Error())
		return ctrl.Result{RequeueAfter: 2 * time.Second}, nil
	}
	return ctrl.Result{}, nil
}

// up makes node's host if it has none (or a dead one).
func (h *Hosts) up(node string) (*Host, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ho := h.hosts[node]; ho != nil && !ho.isDead() {
		return ho, nil
	}
	i := 1
	for h.used[i] {
		i++
	}
	ho := &Host{Node: node, NS: h.NodeNS(node), Index: i, Dir: filepath.Join(h.StateDir, fmt.Sprintf("n%d", i)), domains: map[types.UID]*domain{}}
	ho.RunDir = filepath.Join(ho.Dir, "run")
	killNS(ho.NS) // what a dead host of the same name left
	_ = os.RemoveAll(ho.Dir)
	for _, d := range []string{ho.RunDir, filepath.Join(ho.Dir, "pki"), filepath.Join(ho.Dir, "ca")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	ns, sw := ho.NS, h.SwitchNS()
	u, l, n := fmt.Sprintf("u%d", i), fmt.Sprintf("l%d", i), fmt.Sprintf("h%d", i)
	h.unplug(i) // the switch's ends of a dead host's links, which the kernel may not have freed yet
	steps := [][]string{{"netns", "add", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "link", "add", "br0", "type", "bridge"},
		{"-n", ns, "link", "add", "uplink", "type", "veth", "peer", "name", u, "netns", sw},
		{"-n", ns, "link", "set", "uplink", "master", "br0"},
		{"-n", ns, "link", "add", "ftlog", "type", "veth", "peer", "name", l, "netns", sw},
		{"-n", ns, "addr", "add", fmt.Sprintf("10.215.%d.%d/16", i/256, i%256), "dev", "ftlog"},
		{"-n", ns, "link", "add", "host0", "type", "veth", "peer", "name", n, "netns", sw},
		{"-n", ns, "addr", "add", fmt.Sprintf("10.216.%d.%d/16", i/256, i%256), "dev", "host0"},
	}
	for _, p := range [][2]string{{u, "brw"}, {l, "brl"}, {n, "brn"}} {
		steps = append(steps, []string{"-n", sw, "link", "set", p[0], "master", p[1]}, []string{"-n", sw, "link", "set", p[0], "up"})
	}
	for _, dev := range []string{"br0", "uplink", "ftlog", "host0"} {
		steps = append(steps, []string{"-n", ns, "link", "set", dev, "up"})
	}
	steps = append(steps, []string{"-n", ns, "route", "add", "default", "dev", "host0"})
	if err := ipAll(steps); err != nil {
		killNS(ns)
		return nil, fmt.Errorf("the host of %s: %w", node, err)
	}
	h.hosts[node], h.used[i] = ho, true
	h.Log.Info("host up", "node", node, "netns", ns, "logging address", fmt.Sprintf("10.215.%d.%d", i/256, i%256))
	return ho, nil
}

// kill is the host dying: everything on it is killed, and its namespace goes with its links.
func (h *Hosts) kill(node, why string) {
	h.mu.Lock()
	ho := h.hosts[node]
	if ho == nil || ho.isDead() {
		h.mu.Unlock()
		return
	}
	delete(h.used, ho.Index)
	h.mu.Unlock()
	ho.mu.Lock()
	ho.dead = true
	domains := ho.domains
	ho.domains = map[types.UID]*domain{}
	ho.mu.Unlock()
	// Off the networks first, the API server included (its forwarder is the host's only way
	// there): nothing the host says from now on reaches anyone — not lockstepd's last reports,
	// which a dying host could otherwise still write as its QEMUs die. The moment is kept in
	// <StateDir>/<node>.killed (Unix milliseconds), for the tests' and the demo's timelines.
	at := time.Now()
	ho.mu.Lock()
	if ho.forwarder != nil {
		_ = ho.forwarder.Close()
		ho.forwarder = nil
	}
	ho.mu.Unlock()
	for _, dev := range []string{"ftlog", "uplink", "host0"} {
		_ = exec.Command("ip", "-n", ho.NS, "link", "set", dev, "down").Run()
	}
	_ = os.WriteFile(KilledAtFile(h.StateDir, node), []byte(fmt.Sprint(at.UnixMilli())), 0o644)
	ho.stopLockstepd()
	for _, d := range domains {
		d.kill()
	}
	h.unplug(ho.Index)
	killNS(ho.NS)
	h.Log.Info("host killed", "node", node, "why", why)
}

// cutAPI takes the host's path to the API server away (hack/local-cluster.sh cut-api), its
// forwarded connections with it; the host's networks stay up.
func (h *Hosts) cutAPI(ho *Host) {
	ho.mu.Lock()
	if ho.cut {
		ho.mu.Unlock()
		return
	}
	ho.cut = true
	fwd := ho.forwarder
	ho.forwarder = nil
	ho.mu.Unlock()
	if fwd != nil {
		_ = fwd.Close()
	}
	_ = os.WriteFile(CutAtFile(h.StateDir, ho.Node), []byte(fmt.Sprint(time.Now().UnixMilli())), 0o644)
	h.Log.Info("host cut from the API server", "node", ho.Node)
}

// healAPI gives a cut host its path to the API server back, and its kubelet does what it missed.
func (h *Hosts) healAPI(ho *Host) error {
	ho.mu.Lock()
	if !ho.cut {
		ho.mu.Unlock()
		return nil
	}
	var err error
	if ho.lockstepd != nil && ho.forwarder == nil {
		ho.forwarder, err = h.forwardAPIServer(ho)
	}
	if err != nil {
		ho.mu.Unlock()
		return err
	}
	ho.cut = false
	missed := ho.onHeal
	ho.onHeal = nil
	ho.mu.Unlock()
	h.Log.Info("host's path to the API server healed", "node", ho.Node, "missed", len(missed))
	for _, fn := range missed {
		fn()
	}
	return nil
}

// whenHealed defers fn until the host's path to the API server heals, if it is cut; it says
// whether it did.
func (ho *Host) whenHealed(fn func()) bool {
	ho.mu.Lock()
	defer ho.mu.Unlock()
	if !ho.cut {
		return false
	}
	ho.onHeal = append(ho.onHeal, fn)
	return true
}

func (ho *Host) isCut() bool {
	ho.mu.Lock()
	defer ho.mu.Unlock()
	return ho.cut
}

// CutAtFile is where the moment node's host was last cut from the API server is kept.
func CutAtFile(stateDir, node string) string { return filepath.Join(stateDir, node+".cut") }

// ClockSkewFile holds how many seconds node's host's clock is off (hack/local-cluster.sh
// skew-clock); none or 0: it is right. Its lockstepd reads the clock on its next start.
func ClockSkewFile(stateDir, node string) string { return filepath.Join(stateDir, node+".clock-skew") }

// ClockSkew is how far node's host's clock is off, as its ClockSkewFile says (0: it is right, or
// the file is missing).
func ClockSkew(stateDir, node string) (time.Duration, error) {
	raw, err := os.ReadFile(ClockSkewFile(stateDir, node))
	skew := strings.TrimSpace(string(raw))
	if err != nil || skew == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(skew)
	if err != nil {
		return 0, fmt.Errorf("the clock skew of host %s, %q, is not a whole number of seconds", node, skew)
	}
	return time.Duration(n) * time.Second, nil
}

// lockstepdBinary is the lockstepd the host runs, and its environment's clock skew (none when
// its clock is right).
func (h *Hosts) lockstepdBinary(ho *Host) (string, []string, error) {
	skew, err := ClockSkew(h.StateDir, ho.Node)
	if err != nil || skew == 0 {
		return h.Lockstepd, nil, err
	}
	if h.LockstepdSkewClock == "" {
		return "", nil, fmt.Errorf("host %s's clock is off by %s, and the double has no lockstepd built to run on such a clock (--lockstepd-skew-clock)", ho.Node, skew)
	}
	return h.LockstepdSkewClock, []string{"LOCKSTEP_TEST_CLOCK_SKEW=" + strconv.Itoa(int(skew/time.Second))}, nil
}

// unplug removes the switch's ends of host i's links.
func (h *Hosts) unplug(i int) {
	for _, p := range []string{"u", "l", "h"} {
		_ = exec.Command("ip", "-n", h.SwitchNS(), "link", "delete", fmt.Sprintf("%s%d", p, i)).Run()
	}
}

// KilledAtFile is where the moment node's host was last killed is kept.
func KilledAtFile(stateDir, node string) string { return filepath.Join(stateDir, node+".killed") }

func (ho *Host) isDead() bool {
	ho.mu.Lock()
	defer ho.mu.Unlock()
	return ho.dead
}

func (ho *Host) lockstepdRunning() bool {
	ho.mu.Lock()
	defer ho.mu.Unlock()
	return ho.lockstepd != nil
}

// startLockstepd runs lockstepd on the host as the kubelet runs its DaemonSet's pod on the node:
// the pod's arguments; its ServiceAccount token, bound to the pod; the API server at
// 127.0.0.1:6443 (a forwarder into the host); the lockstepd CA's ConfigMap where the pod mounts
// it; its certificate, which it requests from the operator's signer, in its own directory. The
// pod's status says it runs, and its readiness probe's answers (lockstepdpods.go). When lockstepd
// exits, the next reconcile starts it again, as the kubelet restarts the container.
func (h *Hosts) startLockstepd(ctx context.Context, ho *Host, pod *corev1.Pod) error {
	var ca corev1.ConfigMap
	if err := h.Get(ctx, types.NamespacedName{Namespace: h.DaemonSet.Namespace, Name: "lockstepd-ca"}, &ca); err != nil || ca.Data["ca.crt"] == "" {
		return fmt.Errorf("the lockstepd CA is not published yet (the operator's signer makes it): %v", err)
	}
	tr, err := h.Clientset.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("a token for %s: %w", pod.Name, err)
	}
	if err := os.WriteFile(filepath.Join(ho.Dir, "ca", "ca.crt"), []byte(ca.Data["ca.crt"]), 0o644); err != nil {
		return err
	}
	caData := h.Config.CAData
	if len(caData) == 0 && h.Config.CAFile != "" {
		if caData, err = os.ReadFile(h.Config.CAFile); err != nil {
			return err
		}
	}
	kubeconfig := filepath.Join(ho.Dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://127.0.0.1:6443", certificate-authority-data: %q}}]
users: [{name: lockstepd, user: {token: %q}}]
contexts: [{name: local, context: {cluster: local, user: lockstepd}}]
current-context: local
`, b64(caData), tr.Status.Token)), 0o600); err != nil {
		return err
	}
	if ho.forwarder == nil {
		if ho.forwarder, err = h.forwardAPIServer(ho); err != nil {
			return err
		}
	}
	c := pod.Spec.Containers[0]
	args := append(append([]string{}, c.Args...),
		"--node-name="+ho.Node, "--run-dir="+ho.RunDir,
		"--tls-cert-file="+filepath.Join(ho.Dir, "pki", "tls.crt"), "--tls-key-file="+filepath.Join(ho.Dir, "pki", "tls.key"),
		"--tls-ca-file="+filepath.Join(ho.Dir, "ca", "ca.crt"))
	binary, clock, err := h.lockstepdBinary(ho)
	if err != nil {
		return err
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ho.NS, binary}, args...)...)
	cmd.Env = append(append(os.Environ(), "KUBECONFIG="+kubeconfig, "LOCKSTEPD_NODE_NAME="+ho.Node), clock...)
	logf, err := os.OpenFile(filepath.Join(h.StateDir, ho.Node+"-lockstepd.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, _ = fmt.Fprintf(logf, "--- %s start on host %s: %s %s %s\n", time.Now().UTC().Format(time.RFC3339), ho.NS, strings.Join(clock, " "), binary, strings.Join(args, " "))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := h.podRunning(ctx, ho, pod); err != nil {
		_ = logf.Close()
		return err
	}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return err
	}
	exited := make(chan struct{})
	ho.mu.Lock()
	ho.lockstepd, ho.pod = cmd, pod.UID
	ho.mu.Unlock()
	node := ho.Node
	go func() {
		err := cmd.Wait()
		close(exited)
		_ = logf.Close()
		ho.mu.Lock()
		if ho.lockstepd == cmd {
			ho.lockstepd = nil
		}
		dead, stopping := ho.dead, ho.stopping
		ho.mu.Unlock()
		if !dead && !stopping {
			h.Log.Info("lockstepd exited; it starts again in 2s, as the kubelet restarts a container", "node", node, "err", fmt.Sprint(err))
			time.AfterFunc(2*time.Second, func() { h.requeue(node) })
		}
	}()
	go h.probeReadiness(ho, pod, exited)
	h.Log.Info("lockstepd started", "node", ho.Node, "pod", pod.Name)
	return nil
}

// requeue reconciles node again.
func (h *Hosts) requeue(node string) {
	h.restart <- event.GenericEvent{Object: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}}
}

// stopLockstepd kills the host's lockstepd and its API forwarder.
func (ho *Host) stopLockstepd() {
	ho.mu.Lock()
	cmd, fwd := ho.lockstepd, ho.forwarder
	ho.lockstepd, ho.forwarder = nil, nil
	ho.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Kill()
	}
	if fwd != nil {
		_ = fwd.Close()
	}
}

// KillLockstepd kills node's lockstepd (SIGKILL), as a crash of the container would; the next
// reconcile of the node starts it again.
func (h *Hosts) KillLockstepd(node string) error {
	ho := h.Host(node)
	if ho == nil {
		return fmt.Errorf("node %s has no live host", node)
	}
	ho.mu.Lock()
	cmd := ho.lockstepd
	ho.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return fmt.Errorf("no lockstepd runs on %s", node)
	}
	return cmd.Process.Kill()
}

// forwardAPIServer is the host's path to the API server: 127.0.0.1:6443 inside it, forwarded to
// the API server the double reaches.
func (h *Hosts) forwardAPIServer(ho *Host) (*forwarder, error) {
	return forwardInto(ho.NS, "127.0.0.1:6443", strings.TrimPrefix(strings.TrimSuffix(h.Config.Host, "/"), "https://"))
}

// forwarder accepts TCP connections inside a host's namespace and forwards each to a target in
// the double's own namespace: the API server, for the processes on the host. Close cuts the
// forwarded connections too, as a host that dies loses them.
type forwarder struct {
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]bool
}

func forwardInto(ns, listen, target string) (*forwarder, error) {
	var ln net.Listener
	var err error
	if e := testnet.Enter(ns, func() { ln, err = net.Listen("tcp", listen) }); e != nil {
		return nil, e
	}
	if err != nil {
		return nil, err
	}
	f := &forwarder{ln: ln, conns: map[net.Conn]bool{}}
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go f.pipe(in, target)
		}
	}()
	return f, nil
}

func (f *forwarder) pipe(in net.Conn, target string) {
	out, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		_ = in.Close()
		return
	}
	f.mu.Lock()
	if f.conns == nil { // closed meanwhile
		f.mu.Unlock()
		_ = in.Close()
		_ = out.Close()
		return
	}
	f.conns[in], f.conns[out] = true, true
	f.mu.Unlock()
	copyClose := func(dst, src net.Conn) { _, _ = io.Copy(dst, src); _ = dst.Close(); _ = src.Close() }
	go copyClose(in, out)
	copyClose(out, in)
	f.mu.Lock()
	delete(f.conns, in)
	delete(f.conns, out)
	f.mu.Unlock()
}

// Close stops accepting and cuts every forwarded connection.
func (f *forwarder) Close() error {
	err := f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		_ = c.Close()
	}
	f.conns = nil
	f.mu.Unlock()
	return err
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// ipAll runs ip with each argument list in turn.
func ipAll(steps [][]string) error {
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(s, " "), err, out)
		}
	}
	return nil
}

// SetupWithManager reconciles the nodes and their kwok Leases.
func (h *Hosts) SetupWithManager(mgr ctrl.Manager) error {
	if h.Clientset == nil || h.Config == nil {
		return errors.New("hosts: Clientset and Config are required")
	}
	toNode := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetName()}}}
	})
	h.restart = make(chan event.GenericEvent, 64)
	inNodeLease := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetNamespace() == corev1.NamespaceNodeLease })
	return ctrl.NewControllerManagedBy(mgr).
		Named("hosts-test-double").
		For(&corev1.Node{}, builder.WithPredicates(predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }})).
		Watches(&coordinationv1.Lease{}, toNode, builder.WithPredicates(inNodeLease, holderChanged())).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			if p := o.(*corev1.Pod); p.Namespace == h.DaemonSet.Namespace && p.Spec.NodeName != "" {
				return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: p.Spec.NodeName}}}
			}
			return nil
		})).
		WatchesRawSource(source.Channel(h.restart, toNode)).
		Complete(h)
}

// holderChanged passes Lease events whose holder changed (not kwok's renewals).
func holderChanged() predicate.Predicate {
	holder := func(o client.Object) string {
		if l, ok := o.(*coordinationv1.Lease); ok && l.Spec.HolderIdentity != nil {
			return *l.Spec.HolderIdentity
		}
		return ""
	}
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool { return holder(e.ObjectOld) != holder(e.ObjectNew) }}
}
