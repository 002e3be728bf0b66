//go:build linux

// Package dataplane runs lockstepd (with the counter VM double of test/vmdouble standing in for
// QEMU) as real processes, one per node, each in a network namespace the test makes: a star of
// veth pairs around a hub namespace where Toxiproxy (test/faultproxy) sits in every FT log path.
// The pair's Lease, VMIs and FaultTolerantVM live in a real kube-apiserver (envtest), reached
// from each namespace through a forwarder the test can cut. Outputs of the VMs go, through the
// kernel gate (NFQUEUE), to an observer in the hub; an invariant checker reads what it saw and
// what each VM applied.
package dataplane

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/lockstepd"
	"github.com/lockstep-dev/lockstep/internal/testnet"
	"github.com/lockstep-dev/lockstep/test/apitest"
	"github.com/lockstep-dev/lockstep/test/pki"
	"github.com/lockstep-dev/lockstep/test/vmdouble"
)

// root is the repository's root.
var root = filepath.Join("..", "..")

var (
	restCfg *rest.Config
	k8s     client.Client
	binDir  string
	testSeq atomic.Int32
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "the data-plane tests need root: they make network namespaces and nf_tables rules")
		os.Exit(1)
	}
	var err error
	if binDir, err = os.MkdirTemp("", "lockstep-dataplane-"); err != nil {
		panic(err)
	}
	for bin, pkg := range map[string]string{"lockstepd-vmdouble": "./test/vmdouble/cmd/lockstepd-vmdouble", "faultproxy": "./test/faultproxy/cmd/faultproxy"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, bin), pkg)
		cmd.Dir, cmd.Stdout, cmd.Stderr = root, os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building", pkg, err)
			os.Exit(1)
		}
	}
	env, cfg, c, err := apitest.Start(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "start envtest (make envtest-assets test-crds):", err)
		os.Exit(1)
	}
	restCfg, k8s = cfg, c
	code := m.Run()
	_ = env.Stop()
	_ = os.RemoveAll(binDir)
	os.Exit(code)
}

// Timings of the lockstepd under test: detection in well under a second.
const (
	heartbeat = 20 * time.Millisecond
	timeout   = 150 * time.Millisecond
	detect    = 400 * time.Millisecond
)

// cluster is one test's nodes, their lockstepd processes, the fault proxy and the observer.
type cluster struct {
	t     testing.TB
	ns    string
	star  *testnet.Star
	nodes []*node
	proxy *toxiproxy.Client
	obs   *observer
	dir   string
}

type node struct {
	name       string
	leaf       string
	data, vm   *testnet.Link
	api        func(on bool)
	kubeconfig string
	tlsDir     string
	trace      string
	cmd        *exec.Cmd
	proxy      *toxiproxy.Proxy
}

func (n *node) advertise() string { return n.data.BAddr + ":7000" }

// newCluster makes n nodes ("a", "b", ...), a FaultTolerantVM "vm" and no lockstepd yet.
func newCluster(t testing.TB, n int) *cluster {
	t.Helper()
	id := testSeq.Add(1)
	c := &cluster{t: t, ns: fmt.Sprintf("dp-%d", id), star: testnet.NewStar(t, n), dir: t.TempDir()}
	ctx := context.Background()
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}}); err != nil {
		t.Fatal(err)
	}

	// The fault proxy runs in the hub; the test reaches its API through a forwarder.
	fp := exec.Command("ip", "netns", "exec", c.star.Hub, filepath.Join(binDir, "faultproxy"), "-host", "127.0.0.1", "-port", "8474")
	fp.Stdout, fp.Stderr = logFile(t, c.dir, "faultproxy.log"), logFile(t, c.dir, "faultproxy.log")
	if err := fp.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fp.Process.Kill(); _ = fp.Wait() })
	apiAddr, _ := testnet.Forward(t, "", "127.0.0.1:0", c.star.Hub, "127.0.0.1:8474")
	c.proxy = toxiproxy.NewClient(apiAddr)
	eventually(t, "the fault proxy answers", 10*time.Second, func() bool { _, err := c.proxy.Proxies(); return err == nil })

	c.obs = newObserver(t, c.star.Hub)
	ca := pki.New(t, "lockstep-ca")
	for i := range n {
		nd := &node{name: fmt.Sprintf("dp%d-%c", id, 'a'+i), leaf: c.star.Leaves[i], data: c.star.Data[i], vm: c.star.VM[i]}
		nd.tlsDir = filepath.Join(c.dir, nd.name+"-tls")
		ca.WriteFiles(t, nd.tlsDir, nd.name)
		nd.trace = filepath.Join(c.dir, nd.name+".trace")
		var err error
		if nd.proxy, err = c.proxy.CreateProxy(nd.name, nd.advertise(), nd.data.AAddr+":7410"); err != nil {
			t.Fatal(err)
		}
		var apiFwd string
		apiFwd, nd.api = testnet.Forward(t, nd.leaf, "127.0.0.1:6443", "", strings.TrimSuffix(strings.TrimPrefix(restCfg.Host, "https://"), "/"))
		nd.kubeconfig = apitest.WriteKubeconfig(t, restCfg, c.dir, nd.name, apiFwd)
		if err := k8s.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nd.name}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = k8s.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nd.name}})
		})
		c.nodes = append(c.nodes, nd)
	}
	guest := resource.MustParse("64Mi")
	ftvm := &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "vm"}, Spec: ftv1.FaultTolerantVMSpec{
		LoggingNetwork: ftv1.LoggingNetwork{Name: "ft-logging"},
		Template: ftv1.VMITemplate{Spec: virtv1.VirtualMachineInstanceSpec{Domain: virtv1.DomainSpec{
			CPU: &virtv1.CPU{Cores: 1}, Memory: &virtv1.Memory{Guest: &guest}}}},
	}}
	if err := k8s.Create(ctx, ftvm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs and traces are in %s", c.dir)
			for _, nd := range c.nodes {
				if b, err := os.ReadFile(filepath.Join(c.dir, nd.name+".log")); err == nil {
					t.Logf("--- %s (last lines)\n%s", nd.name, tail(string(b), 40))
				}
			}
		}
	})
	return c
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func logFile(t testing.TB, dir, name string) *os.File {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// runDir is the node's --run-dir, which outlives its lockstepd as a host directory does.
func (c *cluster) runDir(nd *node) string { return filepath.Join(c.dir, nd.name+"-run") }

// start runs the node's lockstepd.
func (c *cluster) start(nd *node) {
	c.t.Helper()
	if err := os.MkdirAll(c.runDir(nd), 0o755); err != nil {
		c.t.Fatal(err)
	}
	args := []string{"netns", "exec", nd.leaf, filepath.Join(binDir, "lockstepd-vmdouble"),
		"--node-name", nd.name, "--run-dir", c.runDir(nd), "--listen-address", nd.data.AAddr + ":7410", "--advertise-address", nd.advertise(),
		"--tls-cert-file", filepath.Join(nd.tlsDir, "tls.crt"), "--tls-key-file", filepath.Join(nd.tlsDir, "tls.key"),
		"--tls-ca-file", filepath.Join(nd.tlsDir, "ca.crt"),
		"--heartbeat", heartbeat.String(), "--timeout", timeout.String(), "--detect", detect.String(),
		"--claim-timeout", "2s", "--status-interval", "500ms",
		"--metrics-bind-address", "127.0.0.1:9410", "--health-probe-bind-address", "127.0.0.1:9411",
		"--gate-hook", "output",
		"--vmdouble-output", nd.vm.BAddr + ":9000", "--vmdouble-interface", nd.vm.AIf,
		"--vmdouble-trace", nd.trace, "--vmdouble-step", "1ms",
	}
	cmd := exec.Command("ip", args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+nd.kubeconfig)
	out := logFile(c.t, c.dir, nd.name+".log")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	nd.cmd = cmd
	c.t.Cleanup(func() { c.kill(nd) })
}

// kill stops the node's lockstepd at once (kill -9): its VM dies with it.
func (c *cluster) kill(nd *node) {
	if nd.cmd != nil && nd.cmd.ProcessState == nil {
		_ = nd.cmd.Process.Kill()
		_ = nd.cmd.Wait()
	}
}

// member creates a running member VMI of the pair on nd.
func (c *cluster) member(name, role string, nd *node) {
	c.t.Helper()
	vmi := &virtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: name, Labels: map[string]string{
			ftv1.LabelPair: "vm", ftv1.LabelRole: role, ftv1.LabelNode: nd.name}},
		Status: virtv1.VirtualMachineInstanceStatus{Phase: virtv1.Running, NodeName: nd.name},
	}
	if err := k8s.Create(context.Background(), vmi); err != nil {
		c.t.Fatal(err)
	}
}

// promote relabels a member as the primary, as the operator does once the primary's node is lost.
func (c *cluster) promote(name string) { c.relabel(name, ftv1.RolePrimary) }

// relabel gives a member a role, as the operator does.
func (c *cluster) relabel(name, role string) {
	c.t.Helper()
	vmi := &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: name}}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, ftv1.LabelRole, role)
	if err := k8s.Patch(context.Background(), vmi, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) ftvm() *ftv1.FaultTolerantVM {
	f := &ftv1.FaultTolerantVM{}
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: c.ns, Name: "vm"}, f); err != nil {
		c.t.Fatal(err)
	}
	return f
}

func (c *cluster) primaryReport() *ftv1.SideStatus {
	if r := c.ftvm().Status.Replication; r != nil {
		return r.Primary
	}
	return nil
}

func (c *cluster) secondaryReport() *ftv1.SideStatus {
	if r := c.ftvm().Status.Replication; r != nil {
		return r.Secondary
	}
	return nil
}

func (c *cluster) lease() (string, int32) {
	l := &coordinationv1.Lease{}
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: c.ns, Name: lockstepd.LeaseName("vm")}, l); err != nil {
		c.t.Fatal(err)
	}
	return *l.Spec.HolderIdentity, *l.Spec.LeaseTransitions
}

func (c *cluster) vmiExists(name string) bool {
	err := k8s.Get(context.Background(), types.NamespacedName{Namespace: c.ns, Name: name}, &virtv1.VirtualMachineInstance{})
	if err != nil && !apierrors.IsNotFound(err) {
		c.t.Fatal(err)
	}
	return err == nil
}

// protect starts a primary "a" on node 0 and a secondary "b" on node 1 and waits until the pair
// is protected, the secondary synchronized and outputs flowing.
func (c *cluster) protect() {
	c.t.Helper()
	c.member("a", ftv1.RolePrimary, c.nodes[0])
	c.member("b", ftv1.RoleSecondary, c.nodes[1])
	c.start(c.nodes[0])
	c.start(c.nodes[1])
	eventually(c.t, "the primary reports Protected", 20*time.Second, func() bool {
		p := c.primaryReport()
		return p != nil && p.VMI == "a" && p.State == "Protected"
	})
	eventually(c.t, "the secondary is marked synchronized", 10*time.Second, func() bool {
		vmi := &virtv1.VirtualMachineInstance{}
		_ = k8s.Get(context.Background(), types.NamespacedName{Namespace: c.ns, Name: "b"}, vmi)
		return vmi.Annotations[ftv1.AnnotationSyncedAt] != ""
	})
	c.obs.markProtected("a")
	eventually(c.t, "outputs of the protected primary", 10*time.Second, func() bool { return c.obs.count("a") > c.obs.protectedFrom("a")+50 })
}

func eventually(t testing.TB, what string, within time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// observer is the VMs' client: it records every output it receives, with the time.
type observer struct {
	mu        sync.Mutex
	outs      []output
	protected map[string]uint64 // VM -> highest value seen when the test saw it protected
	until     map[string]uint64 // VM -> highest value seen when a fault may have left it alone
}

type output struct {
	vm   string
	v    uint64
	mono int64
}

func newObserver(t testing.TB, ns string) *observer {
	o := &observer{protected: map[string]uint64{}, until: map[string]uint64{}}
	var pc net.PacketConn
	testnet.In(t, ns, func() {
		var err error
		if pc, err = net.ListenPacket("udp", "0.0.0.0:9000"); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { _ = pc.Close() })
	go func() {
		buf := make([]byte, 256)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			now := vmdouble.Monotonic()
			name, v, err := vmdouble.ParsePayload(buf[:n])
			if err != nil {
				continue
			}
			o.mu.Lock()
			o.outs = append(o.outs, output{name, v, now})
			o.mu.Unlock()
		}
	}()
	return o
}

// markProtected notes that vm is now protected: its outputs from here on must each follow the
// secondary's acknowledgement. (Outputs it logged while it ran alone left at once; the margin
// covers those still in flight when the test read the status.)
func (o *observer) markProtected(vm string) {
	hi := o.count(vm)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.protected[vm] = hi + 100
}

// faultNow notes that vm may lose its secondary from now on: if it wins the Lease it releases,
// alone, what it held. Outputs above what was seen so far are not checked against a secondary.
func (o *observer) faultNow(vm string) {
	hi := o.count(vm)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.until[vm] = hi
}

// checked says whether an output must have been held by a secondary before it left.
func (o *observer) checked(x output) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	from, ok := o.protected[x.vm]
	if !ok || x.v <= from {
		return false
	}
	until, ok := o.until[x.vm]
	return !ok || x.v <= until
}

func (o *observer) protectedFrom(vm string) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.protected[vm]
}

// count is the highest value of vm's outputs seen so far (its outputs count up from 1).
func (o *observer) count(vm string) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var hi uint64
	for _, x := range o.outs {
		if x.vm == vm {
			hi = max(hi, x.v)
		}
	}
	return hi
}

func (o *observer) all() []output {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]output(nil), o.outs...)
}

// applied is one line of a VM's trace: the secondary applied entry seq, of value v, at mono.
type applied struct {
	vm     string
	seq, v uint64
	mono   int64
}

func readTraces(t testing.TB, c *cluster) []applied {
	var out []applied
	for _, nd := range c.nodes {
		f, err := os.Open(nd.trace)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var a applied
			if n, _ := fmt.Sscanf(sc.Text(), "%s apply %d %d %d", &a.vm, &a.seq, &a.v, &a.mono); n == 4 {
				out = append(out, a)
			}
		}
		_ = f.Close()
	}
	return out
}

// get fetches a URL from inside the node's namespace (its lockstepd's metrics and probes).
func (c *cluster) get(nd *node, url string) (int, string) {
	c.t.Helper()
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return testnet.DialContext(ctx, nd.leaf, network, addr)
	}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// first is when the observer first saw an output of vm (0: never).
func (o *observer) first(vm string) int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, x := range o.outs {
		if x.vm == vm {
			return x.mono
		}
	}
	return 0
}

// deleteMember deletes a member VMI, as the operator does with a member it lost.
func (c *cluster) deleteMember(name string) {
	c.t.Helper()
	vmi := &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: name}}
	if err := k8s.Delete(context.Background(), vmi); client.IgnoreNotFound(err) != nil {
		c.t.Fatal(err)
	}
}
