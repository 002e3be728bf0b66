//go:build linux && vmtier

package vmtier

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/lockstep-dev/lockstep/internal/agent"
	"github.com/lockstep-dev/lockstep/internal/colo"
	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/failover"
	"github.com/lockstep-dev/lockstep/internal/lockstepd"
	"github.com/lockstep-dev/lockstep/internal/lockstepd/coloengine"
	"github.com/lockstep-dev/lockstep/internal/qmp"
	"github.com/lockstep-dev/lockstep/internal/testnet"
	"github.com/lockstep-dev/lockstep/test/counter"
	"github.com/lockstep-dev/lockstep/test/leasedouble"
	"github.com/lockstep-dev/lockstep/test/pki"
	"github.com/lockstep-dev/lockstep/test/virtlauncher"
)

// The pair pairs the VM tier runs with: detection within half a second, a checkpoint at least
// every two seconds (QEMU's default is 20 s; colo-compare forces one sooner whenever the two
// sides' packets differ).
const (
	pairName  = "vmtier/vm"
	heartbeat = 30 * time.Millisecond
	timeout   = 300 * time.Millisecond
	detect    = 500 * time.Millisecond
	diskSize  = 64 << 20
)

// checkpoint is the longest time between two checkpoints: 2s, lockstepd's default, or
// VMTIER_CHECKPOINT (a Go duration).
var checkpoint = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("VMTIER_CHECKPOINT")); err == nil {
		return d
	}
	return 2 * time.Second
}()

// ramAhead says whether the primary sends a checkpoint's dirty pages while its VM still runs
// (lockstepd's --colo-ram-ahead): yes, lockstepd's default, unless VMTIER_RAM_AHEAD=off.
var ramAhead = os.Getenv("VMTIER_RAM_AHEAD") != "off"

// compareTimeout is colo-compare's: 100ms, or VMTIER_COMPARE_TIMEOUT (a Go duration; QEMU's
// default is 3s). Under TCG the secondary rarely produces its packets in time, so the timeout
// sets the latency of the VM's replies (docs/colo.md).
func compareTimeout() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("VMTIER_COMPARE_TIMEOUT")); err == nil {
		return d
	}
	return 100 * time.Millisecond
}

// crossedWait is colo-compare's wait before a checkpoint where both guests' data waits crossed
// (lockstepd's --colo-crossed-wait): VMTIER_CROSSED_WAIT (a Go duration), or lockstepd's default.
func crossedWait() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("VMTIER_CROSSED_WAIT")); err == nil {
		return d
	}
	var o coloengine.Options
	o.BindFlags(flag.NewFlagSet("lockstepd", flag.ContinueOnError))
	return o.CrossedWait
}

// cluster is one test's network, nodes and pair. The network, all in namespaces the test makes:
// a client namespace and a switch namespace with two bridges, brw for the VM's network and brl
// for the logging network; each node namespace has a bridge br0 with the VM's tap and an uplink
// into brw (port u<i> on the switch, up only on the node the VM runs on), and a logging link
// into brl with the node's address.
type cluster struct {
	t           testing.TB
	qemu, guest string
	qemuImage   string // hack/qemu-image.sh's directory, for the libvirt stack's launchers
	client, sw  string
	clientIf    string
	vmAddr      string
	nodes       []*node
	lease       *leasedouble.Lease
	ca          *pki.CA
	dir, runDir string
	inProcess   bool // lockstepd runs in the test process (lockstepd.Node), not as processes
	viaLibvirt  bool // members are launched through the KubeVirt hook and a libvirt daemon each
	vcpus       int  // the guest's vCPUs on the libvirt stack (0: 1)
	// debian: the VM runs the Debian guest (hack/debian-guest.sh, on the libvirt stack), not the
	// busybox counter guest.
	debian *debianGuest
	efi    bool // the guest boots with OVMF (on the libvirt stack), not SeaBIOS
	// dataDisk gives the VM a second claim, which the guest writes each count to as well.
	dataDisk bool
	// secondaryWithoutRAMCache reserves a secondary's memory as a primary's, without its RAM
	// cache (on the libvirt stack): what KubeVirt then gives its launcher.
	secondaryWithoutRAMCache bool
	hookBin                  string
	members                  []*member
	mu                       sync.Mutex
	checkpoints              []colo.Checkpoint
	memberCounter            int
	attachedAt               time.Time // when the VM's network last moved to a node
	// trace: QEMU trace patterns every member runs with (besides VMTIER_TRACE's).
	trace []string
	// period and compareTimeout are the pair's checkpoint period and colo-compare timeout where
	// a scenario sets its own (0: checkpoint and compareTimeout()).
	period, compareTimeout time.Duration
	// crossedWait is colo-compare's wait before it checkpoints for data of both guests waiting
	// crossed, where a scenario sets its own (0: crossedWait(); negative: none).
	crossedWait time.Duration
	// guestNoIPv6 boots the busybox guest with IPv6 off: none of its router solicitations and
	// MLD reports, which colo-compare cannot compare and forces a checkpoint for.
	guestNoIPv6 bool
}

// colo is the COLO timing of the cluster's pair: its checkpoint period and colo-compare timeout.
func (c *cluster) colo() (period, compare time.Duration) {
	period, compare = checkpoint, compareTimeout()
	if c.period != 0 {
		period = c.period
	}
	if c.compareTimeout != 0 {
		compare = c.compareTimeout
	}
	return period, compare
}

// crossed is the pair's wait before colo-compare checkpoints for data of both guests waiting
// crossed (colo.Tuning's CrossedWait).
func (c *cluster) crossed() time.Duration {
	if c.crossedWait != 0 {
		return max(c.crossedWait, 0)
	}
	return crossedWait()
}

// node is a node namespace with its lockstepd's Node (internal/lockstepd): the FT log and stream
// listeners, the relay, the agents, the COLO engine factory that cmd/lockstepd registers.
type node struct {
	name, ns string
	addr     string // on the logging network
	lsd      *lockstepd.Node
	stop     context.CancelFunc
	index    int
}

func (n *node) logAddr() string    { return n.addr + ":7000" }
func (n *node) streamAddr() string { return n.addr + ":7001" }

// member is one side of the pair: the QEMU the test launched as a launcher would, and lockstepd's
// member (engine and agent) attached to it.
type member struct {
	name    string
	node    *node
	spec    lockstepd.MemberSpec
	run     *lockstepd.Member
	engine  *colo.Engine
	agent   *agent.Agent
	vm      colo.VM
	dir     string
	qemuLog string                 // the QEMU's output (and its trace events)
	qemu    *exec.Cmd              // the QEMU process when the test launched it directly
	pid     int                    // the QEMU's pid, however launched
	lv      *virtlauncher.Libvirtd // the member's libvirt daemon, when launched through libvirt
	// cgroup is the memory cgroup of the member's launcher, when launched through libvirt;
	// oomExpected, that the test expects the kernel to kill its QEMU there.
	cgroup      *virtlauncher.MemoryCgroup
	oomExpected bool
	exited      chan struct{}
	launcher    *qmp.Conn // the launcher's own monitor (the test inspects the VM through it)
	cancel      context.CancelFunc
	replicaOf   *member // the earlier secondary whose copies this secondary's are
}

func newCluster(t testing.TB, nodes int) *cluster { return newClusterOf(t, nodes, true) }

// newClusterOf makes the cluster; inProcess runs each node's lockstepd (its Node) in the test
// process; without it, the test runs lockstepd processes itself.
func newClusterOf(t testing.TB, nodes int, inProcess bool) *cluster {
	c := &cluster{inProcess: inProcess, t: t, qemu: build(t, "qemu.sh"), guest: build(t, "guest.sh"), lease: &leasedouble.Lease{}, ca: pki.New(t, "ca"), dir: t.TempDir(),
		trace: []string{"colo_send_ram_ahead", "colo_checkpoint_ram", "colo_send_message"}}
	// The members' directories hold Unix sockets, whose paths end at 107 bytes: a short run
	// directory, as lockstepd's default /var/run/lockstep is.
	runDir, err := os.MkdirTemp("", "ls")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(runDir) })
	c.runDir = runDir
	// The run directory is a hostPath that the launchers' QEMU (not root, on the libvirt stack)
	// reaches, as lockstepd's /var/run/lockstep is.
	if err := os.Chmod(runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cs := testnet.NewLink(t) // A: the client, B: the switch
	c.client, c.sw, c.clientIf = cs.A, cs.B, cs.AIf
	ip(t, "-n", c.client, "addr", "flush", "dev", cs.AIf)
	ip(t, "-n", c.client, "addr", "add", "10.214.1.1/24", "dev", cs.AIf)
	c.vmAddr = "10.214.1.10"
	for _, br := range []string{"brw", "brl", "brn"} {
		ip(t, "-n", c.sw, "link", "add", br, "type", "bridge")
		ip(t, "-n", c.sw, "link", "set", br, "up")
	}
	ip(t, "-n", c.sw, "addr", "flush", "dev", cs.BIf)
	ip(t, "-n", c.sw, "link", "set", cs.BIf, "master", "brw")
	for i := range nodes {
		c.addNode(i)
	}
	if dir := os.Getenv("VMTIER_PCAP"); dir != "" {
		testnet.Capture(t, c.client, c.clientIf, filepath.Join(dir, "client.pcap")) // what the client sees
	}
	return c
}

func (c *cluster) addNode(i int) {
	t := c.t
	n := &node{name: string(rune('a' + i)), ns: testnet.NewNS(t), addr: fmt.Sprintf("10.214.0.%d", i+1), index: i}
	ip(t, "-n", n.ns, "link", "add", "br0", "type", "bridge")
	ip(t, "-n", n.ns, "tuntap", "add", "tap0", "mode", "tap")
	ip(t, "-n", n.ns, "link", "set", "tap0", "master", "br0")
	ip(t, "-n", n.ns, "link", "add", "uplink", "type", "veth", "peer", "name", "u"+n.name, "netns", c.sw)
	ip(t, "-n", n.ns, "link", "set", "uplink", "master", "br0")
	ip(t, "-n", n.ns, "link", "add", "lg", "type", "veth", "peer", "name", "l"+n.name, "netns", c.sw)
	ip(t, "-n", n.ns, "addr", "add", n.addr+"/24", "dev", "lg")
	ip(t, "-n", c.sw, "link", "set", "u"+n.name, "master", "brw")
	ip(t, "-n", c.sw, "link", "set", "l"+n.name, "master", "brl")
	ip(t, "-n", c.sw, "link", "set", "l"+n.name, "up")
	// host0 is the node's own network (its default route, the cluster's pod network): lockstepd
	// must carry nothing of the pairs over it. IPv6 is off on both so that the counters show
	// only what is sent.
	ip(t, "-n", n.ns, "link", "add", "host0", "type", "veth", "peer", "name", "h"+n.name, "netns", c.sw)
	ip(t, "-n", n.ns, "addr", "add", fmt.Sprintf("10.214.3.%d/24", i+1), "dev", "host0")
	ip(t, "-n", c.sw, "link", "set", "h"+n.name, "master", "brn")
	ip(t, "-n", c.sw, "link", "set", "h"+n.name, "up")
	for _, dev := range []string{"lg", "host0"} {
		if out, err := exec.Command("ip", "netns", "exec", n.ns, "sysctl", "-qw", "net.ipv6.conf."+dev+".disable_ipv6=1").CombinedOutput(); err != nil {
			t.Fatalf("sysctl: %v %s", err, out)
		}
	}
	for _, dev := range []string{"br0", "tap0", "uplink", "lg", "host0"} {
		ip(t, "-n", n.ns, "link", "set", dev, "up")
	}
	if !c.inProcess {
		// The node's own network is its default route. In-process lockstepd dials from the
		// test's namespaces without the logging interface's binding, which the lockstepd
		// processes have (--logging-interface).
		ip(t, "-n", n.ns, "route", "add", "default", "dev", "host0")
	}
	c.nodes = append(c.nodes, n)
	if c.inProcess {
		c.startNode(n)
	}
}

// startNode starts the node's lockstepd in the test process: its two listeners, inside the
// node's namespace, and its Node.
func (c *cluster) startNode(n *node) {
	t := c.t
	logLn, streamLn := listenIn(t, n.ns, n.logAddr()), listenIn(t, n.ns, n.streamAddr())
	cfg := lockstepd.DefaultConfig()
	cfg.NodeName, cfg.RunDir = n.name, c.runDir
	cfg.Heartbeat, cfg.Timeout, cfg.Detect, cfg.ClaimTimeout = heartbeat, timeout, detect, 2*time.Second
	cfg.PaceThreshold = 0
	n.lsd = &lockstepd.Node{
		Config: cfg, TLS: c.ca.TLSConfig(t, n.name), Dial: dialFrom(n),
		// The engine's timing is read when a member starts, after a scenario's setup set it.
		NewEngine: func(env lockstepd.EngineEnv) (engine.Engine, error) {
			period, compare := c.colo()
			return coloengine.Factory(coloengine.Options{
				Checkpoint: period, CompareTimeout: compare, CrossedWait: c.crossed(), RAMAhead: ramAhead,
				AttachNetwork: func(context.Context, lockstepd.MemberSpec) error { c.attach(n); return nil },
				OnCheckpoint:  func(_ lockstepd.MemberSpec, cp colo.Checkpoint) { c.recordCheckpoint(cp) },
			})(env)
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.stop = cancel
	go func() { _ = n.lsd.Serve(ctx, logLn, streamLn) }()
	t.Cleanup(cancel)
}

// listenIn listens on addr inside namespace ns, waiting a little for a lockstepd that just
// stopped to let go of it.
func listenIn(t testing.TB, ns, addr string) net.Listener {
	var ln net.Listener
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		testnet.In(t, ns, func() { ln, err = net.Listen("tcp", addr) })
		if err == nil {
			return ln
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// txBytes is what the node sent on its interface dev so far.
func (n *node) txBytes(t testing.TB, dev string) uint64 {
	out, err := exec.Command("ip", "-n", n.ns, "-j", "-s", "link", "show", "dev", dev).Output()
	if err != nil {
		t.Fatalf("ip -s link %s: %v", dev, err)
	}
	var links []struct {
		Stats struct {
			TX struct {
				Bytes uint64 `json:"bytes"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		t.Fatalf("ip -s link %s: %v %s", dev, err, out)
	}
	return links[0].Stats.TX.Bytes
}

// dialFrom dials addr from inside the node's namespace (lockstepd's outgoing connections).
func dialFrom(n *node) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		return testnet.DialContext(ctx, n.ns, "tcp", addr)
	}
}

// attach moves the VM's network to node n: its switch port up, every other one down.
func (c *cluster) attach(n *node) {
	c.mu.Lock()
	c.attachedAt = time.Now()
	c.mu.Unlock()
	for _, o := range c.nodes {
		state := "down"
		if o == n {
			state = "up"
		}
		_ = exec.Command("ip", "-n", c.sw, "link", "set", "u"+o.name, state).Run()
	}
}

// start runs a member on node n as KubeVirt would with lockstep's hook: the test launches the
// member's QEMU itself, in the node's namespace, with the member's directory (lockstepd's monitor
// and the streams) and a monitor of its own; then the node's lockstepd attaches to it through
// the production wiring (Node.StartMember, the COLO engine factory). A primary runs on a fresh
// disk; a secondary waits for the streams of its primary, peer.
func (c *cluster) start(n *node, primary bool, peer *member) *member {
	return c.startOn(n, primary, peer, nil)
}

// startOn is start, for a secondary whose copies are those of replicaOf (nil: blank), as an
// operator gives a new secondary the copies of one that was fenced.
func (c *cluster) startOn(n *node, primary bool, peer, replicaOf *member) *member {
	t := c.t
	c.memberCounter++
	name := fmt.Sprintf("vm-%d-%s", c.memberCounter, n.name)
	spec := lockstepd.MemberSpec{Pair: pairName, VMI: name, UID: uid(t), Identity: n.name + "/" + name, Primary: primary}
	m := &member{name: name, node: n, spec: spec, dir: n.lsd.Dir(spec), exited: make(chan struct{}), replicaOf: replicaOf}
	c.launch(m)
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	t.Cleanup(cancel)
	c.attachLockstepd(ctx, m)
	if peer != nil {
		m.run.SetPeer(ctx, peer.asPeer())
	}
	c.members = append(c.members, m)
	return m
}

// launch starts the member's QEMU as its launcher would: the member's directory, its disks, the
// command line of internal/colo's launcher contract (or, viaLibvirt, KubeVirt's way: launchLibvirt).
func (c *cluster) launch(m *member) {
	t := c.t
	// The member's directory is lockstepd's to make, for the user QEMU runs as, before the
	// launcher pod can start (its hostPath must exist).
	lsd := lockstepd.DefaultConfig()
	if err := lockstepd.PrepareMemberDir(m.dir, lsd.LauncherOwner(), lsd.MemberDirLabel); err != nil {
		t.Fatal(err)
	}
	m.vm = guestVM(c.qemu, c.guest, m.dir, "launcher", c.vmAddr)
	if c.guestNoIPv6 {
		m.vm.Append += " ipv6.disable=1"
	}
	if c.debian != nil {
		m.vm = c.debian.vm(c.qemu, m.dir, "launcher")
	}
	m.vm.Sockets = colo.Sockets{Dir: m.dir}
	// Each disk's claim image and the secondary's copy are raw, as KubeVirt's disk.img on a
	// filesystem claim; the overlays qcow2, as its emptyDisks, of the disk's size. The copy is
	// larger than the disk, as a copy's claim is on a real cluster (it holds the disk and its
	// filesystem's overhead): the secondary opens it at the disk's size. A primary of the Debian
	// guest runs on a copy of its image; a data disk is blank.
	for i, d := range m.disks(c) {
		for img, format := range map[string]string{d.image: "raw", d.Parent: "raw", d.Active: "qcow2", d.Hidden: "qcow2"} {
			if img == d.image && i == 0 && m.spec.Primary && c.debian != nil {
				c.debian.copyDisk(t, img)
				continue
			}
			if img == d.Parent && m.replicaOf != nil {
				if out, err := exec.Command("cp", "--sparse=always", m.replicaOf.disks(c)[i].Parent, img).CombinedOutput(); err != nil {
					t.Fatalf("copying %s's replica: %v\n%s", m.replicaOf.name, err, out)
				}
				continue
			}
			size := d.Bytes
			if img == d.Parent {
				size += copySlack
			}
			qemuImg(t, c.qemu, "create", "-f", format, img, fmt.Sprint(size))
		}
	}
	if c.viaLibvirt {
		c.launchLibvirt(m)
	} else {
		c.launchDirect(m)
	}
	t.Cleanup(m.killQEMU)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q, err := qmp.DialWhenUp(ctx, m.vm.QMP, m.exited)
	if err != nil {
		c.dump()
		t.Fatalf("%s: %v", m.name, err)
	}
	m.launcher = q
	t.Cleanup(func() { _ = q.Close() })
}

// memberDisk is one of a member's disks: the image of its claim (on a primary; a secondary's copy
// is Parent, with its overlays).
type memberDisk struct {
	name   string // the VMI's disk
	serial string // the VMI disk's serial, which the guest sees ("": none)
	image  string
	colo.SecondaryDisk
}

// disks are the member's disks, in the VMI's order: the root disk (the guest's counter), and with
// dataDisk a second claim, which the busybox guest writes each count to as well, and the Debian
// guest's applications keep their state on.
func (m *member) disks(c *cluster) []memberDisk {
	file := func(f string) string { return filepath.Join(m.dir, f) }
	root := int64(diskSize)
	if c.debian != nil {
		root = c.debian.size
	}
	disks := []memberDisk{{name: "rootdisk", image: file("disk.img"),
		SecondaryDisk: colo.SecondaryDisk{Parent: file("parent.img"), Active: file("active.qcow2"), Hidden: file("hidden.qcow2"), Bytes: root}}}
	if c.dataDisk {
		data := memberDisk{name: "datadisk", image: file("data.img"),
			SecondaryDisk: colo.SecondaryDisk{Parent: file("data-parent.img"), Active: file("active-1.qcow2"), Hidden: file("hidden-1.qcow2"), Bytes: diskSize}}
		if c.debian != nil { // the applications' disk (hack/debian-guest/lockstep-data)
			data.Bytes, data.serial = debianDataDiskSize, "data"
		}
		disks = append(disks, data)
	}
	return disks
}

// copySlack is how much larger than the disk a secondary's copy is.
const copySlack = 8 << 20

// launchDirect runs the member's QEMU as the test's own child.
func (c *cluster) launchDirect(m *member) {
	t := c.t
	file := func(f string) string { return filepath.Join(m.dir, f) }
	var secondary []colo.SecondaryDisk
	var primary []string
	for _, d := range m.disks(c) {
		secondary, primary = append(secondary, d.SecondaryDisk), append(primary, d.image)
	}
	args := colo.SecondaryArgs(m.vm, secondary)
	if m.spec.Primary {
		args = colo.PrimaryArgs(m.vm, primary)
	}
	args = append(args, c.diagnostics(m, "hn0")...)
	m.qemuLog = file("qemu.log")
	if dir := os.Getenv("VMTIER_PCAP"); dir != "" {
		m.qemuLog = filepath.Join(dir, m.name+".log")
	}
	logf, err := os.Create(m.qemuLog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = logf.Close() })
	m.qemu = exec.Command("ip", append([]string{"netns", "exec", m.node.ns, filepath.Join(c.qemu, "bin", "qemu-system-x86_64")}, args...)...)
	m.qemu.Stdout, m.qemu.Stderr = logf, logf
	if err := m.qemu.Start(); err != nil {
		t.Fatal(err)
	}
	m.pid = m.qemu.Process.Pid
	go func() { _ = m.qemu.Wait(); close(m.exited) }()
}

// diagnostics are the QEMU arguments that make a member's QEMU tell more, for netdev, its NIC's
// backend.
//
// VMTIER_TRACE: QEMU trace patterns (e.g. "colo_compare*"), written to the QEMU's log, with
// timestamps. VMTIER_LOGS=DIR: once the test ends, the member's QEMU log (its trace) is kept as
// DIR/<member>.qemu.log. VMTIER_PCAP=DIR: the member's NIC traffic as DIR/<member>.pcap (and the client's as
// DIR/client.pcap, newClusterOf). On a secondary the
// dump sits after the COLO filters: it sees what the guest sends and what reaches it; on a
// primary it sits before them: what the tap brings in and what colo-compare released. Once the
// test ends, the member's console is kept beside it.
func (c *cluster) diagnostics(m *member, netdev string) []string {
	var args []string
	patterns := append(strings.Fields(os.Getenv("VMTIER_TRACE")), c.trace...)
	for _, pat := range patterns {
		args = append(args, "-trace", pat)
	}
	if len(patterns) > 0 && !c.viaLibvirt { // libvirt asks for timestamps itself
		args = append(args, "-msg", "timestamp=on")
	}
	if dir := os.Getenv("VMTIER_LOGS"); dir != "" {
		c.t.Cleanup(func() { // before the member's state goes (cleanups run last first)
			if qlog, err := os.ReadFile(m.qemuLog); err == nil {
				_ = os.WriteFile(filepath.Join(dir, m.name+".qemu.log"), qlog, 0o644)
			}
		})
	}
	if dir := os.Getenv("VMTIER_PCAP"); dir != "" {
		args = append(args, "-object", "filter-dump,id=pcap0,netdev="+netdev+",file="+filepath.Join(dir, m.name+".pcap"))
		c.t.Cleanup(func() {
			console, _ := os.ReadFile(m.vm.Serial)
			_ = os.WriteFile(filepath.Join(dir, m.name+".console"), console, 0o644)
		})
	}
	return args
}

// attachLockstepd runs the member on its node's lockstepd, with the pair's record as the lease
// double.
func (c *cluster) attachLockstepd(ctx context.Context, m *member) {
	run, err := m.node.lsd.StartMember(ctx, m.spec, c.lease.Side(m.spec.Identity), testLogger(c.t, m.name), nil)
	if err != nil {
		c.t.Fatalf("%s: %v", m.name, err)
	}
	m.run, m.agent, m.engine = run, run.Agent, run.Engine.(*colo.Engine)
}

// asPeer is m as the other member's agent knows it: where its node's lockstepd takes the FT log
// and the streams.
func (m *member) asPeer() agent.Peer {
	return agent.Peer{VMI: m.name, Node: m.node.name, Addr: m.node.logAddr(), StreamAddr: m.node.streamAddr()}
}

// uid is a member VMI's UID: 36 characters, as Kubernetes makes them (the member's directory
// is named by it, and its sockets' paths must stay under 108 bytes).
func uid(t testing.TB) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// protect pairs the running primary p with a new secondary on node n and waits until p is
// Protected: the secondary holds the whole VM and COLO runs.
func (c *cluster) protect(p *member, n *node) *member {
	c.t.Helper()
	return c.protectOn(p, n, nil)
}

// protectOn is protect, with a secondary on the copies of replicaOf (nil: blank copies).
func (c *cluster) protectOn(p *member, n *node, replicaOf *member) *member {
	c.t.Helper()
	s := c.startOn(n, false, p, replicaOf)
	peer := s.asPeer()
	if replicaOf != nil {
		peer.ReplicaOf = replicaOf.name
	}
	p.run.SetPeer(context.Background(), peer)
	c.waitState(p, failover.Protected, 5*time.Minute)
	if st := s.agent.Status(); !st.Synced {
		c.t.Fatalf("the secondary is not synchronized once the primary is protected: %+v", st)
	}
	return s
}

func (c *cluster) waitState(m *member, want failover.State, limit time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(limit)
	for m.agent.State() != want {
		if time.Now().After(deadline) {
			c.dump()
			c.t.Fatalf("%s: state %s, want %s (%+v)", m.name, m.agent.State(), want, m.agent.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (c *cluster) recordCheckpoint(cp colo.Checkpoint) {
	c.mu.Lock()
	c.checkpoints = append(c.checkpoints, cp)
	c.mu.Unlock()
}

// dump logs every member's console and QEMU log, for a failing test.
func (c *cluster) dump() {
	c.mu.Lock()
	c.t.Logf("%d checkpoints; the last ones: %+v", len(c.checkpoints), c.checkpoints[max(0, len(c.checkpoints)-3):])
	c.mu.Unlock()
	for _, m := range c.members {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		for _, cmd := range []string{"query-status", "query-colo-status", "query-migrate", "query-block-jobs"} {
			var out any
			err := m.launcher.Execute(ctx, cmd, nil, &out)
			c.t.Logf("%s %s: %v %v", m.name, cmd, out, err)
		}
		// The NIC's virtio state (on the libvirt stack): a disabled device or a stalled queue
		// shows here.
		var status any
		err := m.launcher.Execute(ctx, "x-query-virtio-status", map[string]any{"path": libvirtNIC}, &status)
		c.t.Logf("%s virtio status: %v %v", m.name, status, err)
		for q := range 2 {
			var out any
			err := m.launcher.Execute(ctx, "x-query-virtio-queue-status", map[string]any{"path": libvirtNIC, "queue": q}, &out)
			c.t.Logf("%s virtio queue %d: %v %v", m.name, q, out, err)
		}
		cancel()
		for range 3 {
			var regs string
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = m.launcher.Execute(ctx, "human-monitor-command", map[string]any{"command-line": "info registers"}, &regs)
			cancel()
			if i := strings.Index(regs, "RIP="); i >= 0 {
				c.t.Logf("%s %s", m.name, regs[i:min(len(regs), i+60)])
			}
			time.Sleep(500 * time.Millisecond)
		}
		links, _ := exec.Command("ip", "-n", m.node.ns, "-s", "link", "show", "tap0").CombinedOutput()
		c.t.Logf("%s tap0: %s", m.name, links)
		console, _ := os.ReadFile(m.vm.Serial)
		qlog, _ := os.ReadFile(m.qemuLog)
		c.t.Logf("%s console:\n%s\n%s QEMU:\n%s", m.name, tail(console), m.name, qlog)
	}
}

func tail(b []byte) string {
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// client is the test's client of the counter: it checks every reply against the last one.
type client struct {
	c    *cluster
	last int
	boot string
	// addr is the counter's address (ip:port); "" is the VM's IPv4 address.
	addr string
	// dialTimeout bounds each connection attempt (counter.AskDialing; 0: the kernel's SYN
	// retransmissions).
	dialTimeout time.Duration
}

// next asks until the VM answers (within limit) and checks that the count is the next one,
// the boot id the same, and the disk in the guest's view holds it.
func (cl *client) next(what string, limit time.Duration) time.Time {
	t := cl.c.t
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		addr := cl.addr
		if addr == "" {
			addr = cl.c.vmAddr + ":7777"
		}
		r, err := counter.AskDialing(context.Background(), cl.c.client, addr, cl.dialTimeout)
		count, id, disk := r.Count, r.BootID, r.Disk
		if err == nil {
			at := time.Now()
			if cl.boot == "" {
				cl.boot, cl.last = id, count-1
			}
			if count != cl.last+1 || id != cl.boot || disk != count {
				cl.c.dump()
				t.Fatalf("%s: count %d after %d, boot id %s (first %s), the guest's disk %d", what, count, cl.last, id, cl.boot, disk)
			}
			cl.last = count
			return at
		}
		if time.Now().After(deadline) {
			cl.c.dump()
			t.Fatalf("%s: no answer within %s: %v", what, limit, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// untilOneSideRuns asks the VM all along while the pair of a and b is decided after what: a reply
// from either side must be the next count. It returns once one side runs the VM alone and the
// other is fenced with its QEMU stopped.
func (cl *client) untilOneSideRuns(a, b *member, what string) (winner, loser *member) {
	c, t := cl.c, cl.c.t
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for winner == nil {
		if time.Now().After(deadline) {
			c.dump()
			t.Fatalf("no side runs the VM alone a minute after %s: %s %+v, %s %+v", what, a.name, a.agent.Status(), b.name, b.agent.Status())
		}
		if count, id, disk, err := ask(c.client, c.vmAddr+":7777"); err == nil {
			if count != cl.last+1 || id != cl.boot || disk != count {
				c.dump()
				t.Fatalf("after %s: count %d after %d, boot id %s (first %s), disk %d", what, count, cl.last, id, cl.boot, disk)
			}
			cl.last = count
		}
		switch {
		case a.agent.State() == failover.Alone && b.agent.State() == failover.Fenced:
			winner, loser = a, b
		case b.agent.State() == failover.Alone && a.agent.State() == failover.Fenced:
			winner, loser = b, a
		default:
			time.Sleep(20 * time.Millisecond)
		}
	}
	select {
	case <-loser.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the fenced side's QEMU still runs 10s after it was fenced", what)
	}
	return winner, loser
}

// serveFor asks twice a second for d: a VM that went live from a corrupted state fails within
// seconds (an earlier QEMU, without hack/qemu/colo-tcg-checkpoint-translations.patch, hung ~10 s
// after going live).
func (cl *client) serveFor(what string, d time.Duration) {
	cl.c.t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); {
		cl.next(what, 10*time.Second)
		time.Sleep(500 * time.Millisecond)
	}
}

var sector = regexp.MustCompile(`count=(\d+)`)

// checkDisk reads the counter's sector of each of the VM's disks as QEMU's block layer on m has
// it (not the guest's page cache): m exports each disk read-only over NBD, and qemu-io reads it.
// Each must hold the last acknowledged count.
func (cl *client) checkDisk(m *member) {
	t := cl.c.t
	t.Helper()
	cl.c.readDisks(t, m, func(read func(i int, command string) string) {
		for i, d := range m.disks(cl.c) {
			offset := 0 // the busybox guest's counter is sector 0 of each disk; the Debian guest's, of a partition of its root disk
			if cl.c.debian != nil && i == 0 {
				offset = debianCounterOffset
			}
			out := read(i, fmt.Sprintf("read -v %d 16", offset))
			// "00000000:  63 6f 75 6e 74 3d 31 32 0a 00 ...  count.12........"
			var ascii strings.Builder
			for _, line := range strings.Split(out, "\n") {
				if i := strings.LastIndex(line, "  "); i > 0 && strings.HasPrefix(line, fmt.Sprintf("%08x", offset)) {
					ascii.WriteString(line[i+2:])
				}
			}
			got := sector.FindStringSubmatch(strings.Replace(ascii.String(), "count.", "count=", 1))
			if got == nil || got[1] != fmt.Sprint(cl.last) {
				t.Fatalf("the %s's counter on %s reads %q, want count=%d", d.name, m.name, out, cl.last)
			}
			t.Logf("the %s on %s holds count=%s", d.name, m.name, got[1])
		}
	})
}

// readDisks exports member m's disks read-only over NBD, as its QEMU's block layer has them (not
// the guest's page cache), while fn runs: fn's read runs a qemu-io command on the i-th disk and
// returns what qemu-io said (a failed command fails the test).
func (c *cluster) readDisks(t testing.TB, m *member, fn func(read func(i int, command string) string)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sock := filepath.Join(m.dir, "check.sock")
	if err := m.launcher.Execute(ctx, "nbd-server-start", map[string]any{"addr": map[string]any{"type": "unix", "data": map[string]any{"path": sock}}}, nil); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.launcher.Execute(ctx, "nbd-server-stop", nil, nil) }()
	exported := map[int]bool{}
	fn(func(i int, command string) string {
		t.Helper()
		name := fmt.Sprintf("check%d", i)
		if !exported[i] {
			if err := m.launcher.Execute(ctx, "nbd-server-add", map[string]any{"device": colo.DiskNode(i), "name": name, "writable": false}, nil); err != nil {
				t.Fatal(err)
			}
			exported[i] = true
		}
		out, err := exec.CommandContext(ctx, filepath.Join(c.qemu, "bin", "qemu-io"), "-r", "-f", "raw",
			"nbd+unix:///"+name+"?socket="+sock, "-c", command).CombinedOutput()
		if err != nil {
			t.Fatalf("qemu-io %q on %s: %v\n%s", command, m.name, err, out)
		}
		return string(out)
	})
}

// qemuImg runs qemu-img (to make the members' disk images).
func qemuImg(t testing.TB, qemu string, args ...string) {
	if out, err := exec.Command(filepath.Join(qemu, "bin", "qemu-img"), args...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img %v: %v\n%s", args, err, out)
	}
}

func testLogger(t testing.TB, name string) logr.Logger {
	return funcr.New(func(prefix, args string) {
		if os.Getenv("VMTIER_VERBOSE") != "" {
			fmt.Fprintf(os.Stderr, "%s %s %s %s\n", time.Now().Format("15:04:05.000"), name, prefix, args)
		}
	}, funcr.Options{Verbosity: 1})
}

// killQEMU kills member m's QEMU (kill -9), as a crash of the VM process, and waits until it is
// gone.
func (m *member) killQEMU() {
	if m.pid != 0 {
		m.kill9()
		<-m.exited
	}
}

// kill9 sends the member's QEMU SIGKILL and returns at once.
func (m *member) kill9() {
	if m.pid != 0 {
		_ = syscall.Kill(m.pid, syscall.SIGKILL)
	}
}

// running reports whether the member's QEMU still runs.
func (m *member) running() bool {
	select {
	case <-m.exited:
		return false
	default:
		return true
	}
}

// stopLockstepd ends the node's lockstepd as a crash of its process would: its listeners close,
// its agents end and let go of their QEMUs (monitors, relayed streams); the QEMUs run on.
func (c *cluster) stopLockstepd(n *node) {
	n.stop()
	for _, m := range c.members {
		if m.node == n && m.run != nil {
			m.run.Stop()
		}
	}
}

// restartLockstepd starts the node's lockstepd again, on the same addresses, and attaches it to
// the members whose QEMU still runs there, with the role each had.
func (c *cluster) restartLockstepd(n *node) {
	c.stopLockstepd(n)
	c.startNode(n)
	for _, m := range c.members {
		if m.node == n && m.running() {
			mctx, mcancel := context.WithCancel(context.Background())
			m.cancel = mcancel
			c.t.Cleanup(mcancel)
			c.attachLockstepd(mctx, m)
		}
	}
}

// crashNode takes node n off both networks and kills what runs there: its QEMU and its
// lockstepd (the agents, the listeners).
func (c *cluster) crashNode(n *node) {
	ip(c.t, "-n", n.ns, "link", "set", "lg", "down")
	ip(c.t, "-n", n.ns, "link", "set", "uplink", "down")
	for _, m := range c.members {
		if m.node == n {
			m.killQEMU()
			if m.lv != nil {
				m.lv.Kill()
			}
		}
	}
	c.stopLockstepd(n)
}
