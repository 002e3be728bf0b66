//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/member"
	"github.com/lockstep-dev/lockstep/internal/placement"
	"github.com/lockstep-dev/lockstep/test/localcluster"
)

// The chaos suite: CHAOS_SEED (default: from the clock) and CHAOS_STEPS (default 40) choose the
// schedule; CHAOS_BUDGET (default 3m, unless CHAOS_STEPS is set; 0: none) bounds how long its
// faults run, after the first minSteps: the steps left then are dropped, and the report names the
// CHAOS_STEPS that repeats what ran. `make test-chaos` runs it on its own local cluster
// (lockstep-chaos, CHAOS_KEEP=1 leaves it up). On a violation it prints the seed and the schedule.

const (
	ns        = "chaos"
	nodes     = 8
	poll      = 250 * time.Millisecond
	maxPerVMs = 4 // the operator's default FT limit: members per node
	maxVCPUs  = 8 // and vCPUs per node
	// settleBound is how long every FaultTolerantVM that runs may take to be Protected again
	// once the faults stop and every node is back; the time it took is reported.
	settleBound = 3 * time.Minute
	// defaultBudget bounds the faults of a schedule of the default length: on this machine 40
	// steps take from under 2 to over 4 minutes, as the seed draws long flaps or not.
	defaultBudget = 3 * time.Minute
	// minSteps run whatever the budget: the first VMs, and faults among them.
	minSteps = 20
)

var (
	k8s client.WithWatch
	// Installed as users install it: the chart, with the operator's webhooks answering.
	lc = localcluster.New("lockstep-chaos", "CHAOS_KEEP", "INSTALL=helm", "NODE_LOST_GRACE=5s")
	up bool
)

func TestChaos(t *testing.T) {
	RegisterFailHandler(Fail)
	if !RunSpecs(t, "lockstep chaos suite (local cluster)") {
		// Last, where a shortened log still shows it: CHAOS_SEED=<seed> runs the schedule again.
		seed, n := seedAndSteps()
		if ran > 0 {
			n = ran
		}
		fmt.Printf("chaos: failed with CHAOS_SEED=%d CHAOS_STEPS=%d\n", seed, n)
	}
}

func cluster(args ...string) string {
	out, err := lc.Run(args...)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return out
}

// killNode kills a node's host. Just after a revival kwok has not made the node's Lease again,
// which kill-node needs: it is retried until it can be done.
func killNode(node string) {
	Eventually(func() error {
		_, err := lc.Run("kill-node", node)
		return err
	}).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
}

var _ = BeforeSuite(func() {
	up = true
	Expect(lc.Up(nodes)).To(Succeed())
	var err error
	k8s, err = lc.Client(100, 200)
	Expect(err).NotTo(HaveOccurred())
	Expect(k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	Expect(k8s.Create(context.Background(), localcluster.LoggingNetwork(ns))).To(Succeed())
})

var _ = AfterSuite(func() {
	if !up {
		return
	}
	msg, err := lc.End()
	GinkgoWriter.Println(msg)
	Expect(err).NotTo(HaveOccurred())
})

var _ = ReportAfterEach(func(r SpecReport) {
	if !r.Failed() || !up {
		return
	}
	for name, tail := range lc.Logs(80) {
		AddReportEntry(name+" (tail)", tail)
	}
})

// ran is how many steps of the schedule ran, once the budget cut it (0: all of it).
var ran int

// clockSeed is the seed when CHAOS_SEED is not set: taken once, so that every report names it.
var clockSeed = uint64(time.Now().UnixNano() % 1_000_000)

func seedAndSteps() (uint64, int) {
	seed, steps, err := FromEnv("CHAOS_SEED", "CHAOS_STEPS", clockSeed, 40)
	Expect(err).NotTo(HaveOccurred())
	return seed, steps
}

var _ = Describe("a seeded schedule of faults", func() {
	It("never breaks an invariant, and protects every VM again once the faults stop", func(sctx SpecContext) {
		seed, n := seedAndSteps()
		steps := Schedule(seed, n, Model{Nodes: nodes, MaxVMs: 10, MaxNode: 12})
		schedule := Format(seed, steps)
		GinkgoWriter.Print(schedule)
		fmt.Printf("chaos: seed %d, %d steps\n", seed, n)

		budget, err := BudgetFromEnv("CHAOS_BUDGET", "CHAOS_STEPS", defaultBudget)
		Expect(err).NotTo(HaveOccurred())

		mon := startMonitor()
		took := watchPromotions(sctx, k8s)
		r := &runner{dead: map[string]bool{}}
		faultsEnd := time.Now().Add(budget)
		for i, s := range steps {
			if budget > 0 && i >= minSteps && time.Now().After(faultsEnd) {
				ran, steps, schedule = i, steps[:i], Format(seed, steps[:i])
				fmt.Printf("chaos: the budget of %s ran out after %d of %d steps; CHAOS_SEED=%d CHAOS_STEPS=%d repeats what ran\n",
					budget, i, n, seed, i)
				break
			}
			mon.note(s.String())
			r.run(sctx, s)
			Expect(mon.violations()).To(BeEmpty(), "invariant broken at or before step %d\n%s", s.N, schedule)
		}

		By("settling: every node back, the operator running")
		settleStart := time.Now()
		for node := range r.dead {
			cluster("revive-node", node)
		}
		cluster("start", "operator")
		Eventually(func(g Gomega) {
			var list ftv1.FaultTolerantVMList
			g.Expect(k8s.List(sctx, &list, client.InNamespace(ns))).To(Succeed())
			for _, f := range list.Items {
				if f.Spec.RunStrategy == ftv1.RunStrategyHalted {
					g.Expect(f.Status.State).To(Equal(ftv1.StateStopped), f.Name)
					continue
				}
				g.Expect(f.Status.State).To(Equal(ftv1.StateProtected), "%s: %+v", f.Name, f.Status.Conditions)
				// A status written before the last faults can still say Protected: a promotion
				// that lockstepd recorded while the operator was down is counted, and the VM
				// protected again, only once the restarted operator leads. The count shows it.
				g.Expect(f.Status.FailoverCount).To(Equal(took.of(f.UID)), "%s: failovers counted against promotions seen", f.Name)
			}
		}).WithTimeout(settleBound).WithPolling(time.Second).Should(Succeed(), "not every VM Protected again with its failovers counted\n%s", schedule)
		fmt.Printf("chaos: every VM Protected %.1fs after the faults stopped\n", time.Since(settleStart).Seconds())
		time.Sleep(2 * time.Second) // the monitor sees the settled state
		Expect(mon.violations()).To(BeEmpty(), "%s", schedule)

		By("the failover counts equal the promotions seen")
		var list ftv1.FaultTolerantVMList
		Expect(k8s.List(sctx, &list, client.InNamespace(ns))).To(Succeed())
		for _, f := range list.Items {
			Expect(f.Status.FailoverCount).To(Equal(took.of(f.UID)), "FaultTolerantVM %s; its members as seen:\n%s%s", f.Name, took.seen(f.UID), schedule)
		}

		By("deleting every FaultTolerantVM leaves nothing behind")
		Expect(k8s.DeleteAllOf(sctx, &ftv1.FaultTolerantVM{}, client.InNamespace(ns))).To(Succeed())
		Eventually(func() []string { return leftovers(sctx, "") }).WithTimeout(2*time.Minute).WithPolling(time.Second).
			Should(BeEmpty(), "%s", schedule)
		mon.stop()
		Expect(mon.violations()).To(BeEmpty(), "%s", schedule)
		fmt.Printf("chaos: seed %d, %d steps (%s): no violation; %d promotions seen, %d operator kills mid-failover landed\n",
			seed, len(steps), countActions(steps), took.total(), r.midFailoverKills)
	}, NodeTimeout(90*time.Minute))
})

// runner carries out steps.
type runner struct {
	dead map[string]bool
	// midFailoverKills counts the operator kills that landed while a failover was under way.
	midFailoverKills int
}

func countActions(steps []Step) string {
	n := map[Action]int{}
	for _, s := range steps {
		n[s.Action]++
	}
	keys := make([]string, 0, len(n))
	for a := range n {
		keys = append(keys, string(a))
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, n[Action(k)]))
	}
	return strings.Join(parts, ", ")
}

func (r *runner) run(ctx context.Context, s Step) {
	By(s.String())
	switch s.Action {
	case KillNode:
		killNode(s.Target)
		r.dead[s.Target] = true
	case ReviveNode:
		cluster("revive-node", s.Target)
		delete(r.dead, s.Target)
	case FlapNode:
		killNode(s.Target)
		time.Sleep(s.Hold)
		if !r.dead[s.Target] {
			cluster("revive-node", s.Target)
		}
	case AddNode:
		cluster("add-node", s.Target, "zone-"+string(rune('a'+len(s.Target)%3)))
	case KillOperator:
		cluster("kill", "operator")
		time.Sleep(s.Hold)
		cluster("start", "operator")
	case KillMidFailover:
		r.killMidFailover(ctx, s)
	case Create:
		Expect(k8s.Create(ctx, newFTVM(s.Target, s.VCPUs))).To(Succeed())
	case Delete:
		err := k8s.Delete(ctx, &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: s.Target}})
		Expect(client.IgnoreNotFound(err)).To(Succeed())
	case Halt, Run:
		rs := ftv1.RunStrategyHalted
		if s.Action == Run {
			rs = ftv1.RunStrategyRunning
		}
		patch := fmt.Sprintf(`{"spec":{"runStrategy":%q}}`, rs)
		err := k8s.Patch(ctx, &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: s.Target}}, client.RawPatch(types.MergePatchType, []byte(patch)))
		Expect(client.IgnoreNotFound(err)).To(Succeed())
	case Wait:
		time.Sleep(s.Hold)
	}
}

// killMidFailover kills the node of a running primary, waits until the operator acts on it (a
// member fenced or a secondary labelled primary), SIGKILLs the operator right then, starts it
// again after the step's hold, and brings the node back.
func (r *runner) killMidFailover(ctx context.Context, s Step) {
	var vmis virtv1.VirtualMachineInstanceList
	Expect(k8s.List(ctx, &vmis, client.InNamespace(ns), client.MatchingLabels{ftv1.LabelRole: ftv1.RolePrimary})).To(Succeed())
	var node, pair string
	for _, v := range vmis.Items {
		if n := v.Labels[ftv1.LabelNode]; v.Status.Phase == virtv1.Running && !r.dead[n] {
			node, pair = n, v.Labels[ftv1.LabelPair]
			break
		}
	}
	if node == "" {
		return
	}
	GinkgoWriter.Printf("    primary of %s on %s\n", pair, node)
	killNode(node)
	deadline := time.Now().Add(45 * time.Second)
	for time.Now().Before(deadline) {
		var now virtv1.VirtualMachineInstanceList
		Expect(k8s.List(ctx, &now, client.InNamespace(ns), client.MatchingLabels{ftv1.LabelPair: pair})).To(Succeed())
		acted := false
		for _, v := range now.Items {
			if v.Labels[ftv1.LabelRole] == ftv1.RoleFenced || v.Labels[ftv1.LabelRole] == ftv1.RolePrimary && v.Labels[ftv1.LabelNode] != node {
				acted = true
			}
		}
		if acted {
			r.midFailoverKills++
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cluster("kill", "operator")
	time.Sleep(s.Hold)
	cluster("start", "operator")
	cluster("revive-node", node)
}

func newFTVM(name string, vcpus int) *ftv1.FaultTolerantVM {
	mem := resource.MustParse("1Gi")
	return &ftv1.FaultTolerantVM{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: ftv1.FaultTolerantVMSpec{
			RunStrategy:    ftv1.RunStrategyRunning,
			LoggingNetwork: ftv1.LoggingNetwork{Name: "ft-logging"},
			Template: ftv1.VMITemplate{Spec: virtv1.VirtualMachineInstanceSpec{Domain: virtv1.DomainSpec{
				CPU:    &virtv1.CPU{Cores: uint32(vcpus)},
				Memory: &virtv1.Memory{Guest: &mem},
			}}},
		},
	}
}

// monitor polls the API throughout and records every broken invariant.
type monitor struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	bad      []string
	lastStep string
	goneAt   map[string]time.Time // FaultTolerantVM name -> when it was first seen gone
}

func startMonitor() *monitor {
	ctx, cancel := context.WithCancel(context.Background())
	m := &monitor{cancel: cancel, done: make(chan struct{}), goneAt: map[string]time.Time{}}
	go func() {
		defer close(m.done)
		t := time.NewTicker(poll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				m.check(ctx)
			}
		}
	}()
	return m
}

func (m *monitor) note(step string) {
	m.mu.Lock()
	m.lastStep = step
	m.mu.Unlock()
}

func (m *monitor) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, b := range m.bad {
		if strings.HasSuffix(b, msg) {
			return
		}
	}
	m.bad = append(m.bad, fmt.Sprintf("[during %s] %s", strings.TrimSpace(m.lastStep), msg))
}

// check is one look at the cluster.
func (m *monitor) check(ctx context.Context) {
	var vmis virtv1.VirtualMachineInstanceList
	var ftvms ftv1.FaultTolerantVMList
	var nodeList corev1.NodeList
	if k8s.List(ctx, &vmis, client.InNamespace(ns)) != nil || k8s.List(ctx, &ftvms, client.InNamespace(ns)) != nil || k8s.List(ctx, &nodeList) != nil {
		return // the API server is busy; look again
	}
	limits := map[string][2]int{}
	for i := range nodeList.Items {
		l, _ := member.NodeLimits(placement.Limits{MaxMembers: maxPerVMs, MaxVCPUs: maxVCPUs}, &nodeList.Items[i])
		limits[nodeList.Items[i].Name] = [2]int{l.MaxMembers, l.MaxVCPUs}
	}
	type use struct{ members, vcpus int }
	perNode := map[string]*use{}
	byOwner := map[types.UID][]virtv1.VirtualMachineInstance{}
	for _, v := range vmis.Items {
		owner := metav1.GetControllerOf(&v)
		if owner == nil {
			continue
		}
		byOwner[owner.UID] = append(byOwner[owner.UID], v)
		if v.IsFinal() {
			continue
		}
		node := v.Labels[ftv1.LabelNode]
		if perNode[node] == nil {
			perNode[node] = &use{}
		}
		perNode[node].members++
		perNode[node].vcpus += member.VCPUs(&v.Spec)
	}
	for node, u := range perNode {
		if l, ok := limits[node]; ok && (u.members > l[0] || u.vcpus > l[1]) {
			m.fail("node %s holds %d members, %d vCPUs: above its FT limit %d/%d", node, u.members, u.vcpus, l[0], l[1])
		}
	}
	m.mu.Lock()
	for _, members := range byOwner {
		var primaries []string
		nodeOf := map[string]string{}
		for _, v := range members {
			if v.Labels[ftv1.LabelRole] == ftv1.RolePrimary {
				primaries = append(primaries, v.Name)
			}
			if v.DeletionTimestamp == nil && !v.IsFinal() {
				node := v.Labels[ftv1.LabelNode]
				if other, ok := nodeOf[node]; ok {
					m.mu.Unlock()
					m.fail("members %s and %s of one pair on node %s", other, v.Name, node)
					m.mu.Lock()
				}
				nodeOf[node] = v.Name
			}
		}
		if len(primaries) > 1 {
			sort.Strings(primaries)
			m.mu.Unlock()
			m.fail("two members labelled primary at once: %v", primaries)
			m.mu.Lock()
		}
	}
	m.mu.Unlock()
	for _, f := range ftvms.Items {
		if p, s := f.Status.Primary, f.Status.Secondary; p != nil && s != nil && p.Node == s.Node {
			m.fail("%s: status shows primary %s and secondary %s both on node %s", f.Name, p.VMI, s.VMI, p.Node)
		}
	}
	// Nothing is left of a FaultTolerantVM that is gone (allowing the API a moment to delete).
	present := map[string]bool{}
	for _, f := range ftvms.Items {
		present[f.Name] = true
	}
	for _, name := range namesOfLeftovers(ctx) {
		if present[name] {
			delete(m.goneAt, name)
			continue
		}
		m.mu.Lock()
		at, ok := m.goneAt[name]
		if !ok {
			m.goneAt[name] = time.Now()
		}
		m.mu.Unlock()
		if ok && time.Since(at) > 30*time.Second {
			m.fail("FaultTolerantVM %s is gone, but %v is left", name, leftovers(ctx, name))
		}
	}
}

// namesOfLeftovers lists the FaultTolerantVM names that objects the operator made belong to.
func namesOfLeftovers(ctx context.Context) []string {
	set := map[string]bool{}
	for _, l := range leftovers(ctx, "") {
		set[strings.Fields(l)[0]] = true
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	return out
}

// leftovers lists "<ftvm> <kind>/<name>" for each object the operator made for pair (every pair
// when ""): members, disk copies, records.
func leftovers(ctx context.Context, pair string) []string {
	sel := client.MatchingLabels{ftv1.LabelManagedBy: ftv1.ManagedByValue}
	if pair != "" {
		sel[ftv1.LabelPair] = pair
	}
	var out []string
	var vmis virtv1.VirtualMachineInstanceList
	if k8s.List(ctx, &vmis, client.InNamespace(ns), sel) == nil {
		for _, v := range vmis.Items {
			out = append(out, v.Labels[ftv1.LabelPair]+" VirtualMachineInstance/"+v.Name)
		}
	}
	var pvcs corev1.PersistentVolumeClaimList
	if k8s.List(ctx, &pvcs, client.InNamespace(ns), sel) == nil {
		for _, c := range pvcs.Items {
			out = append(out, c.Labels[ftv1.LabelPair]+" PersistentVolumeClaim/"+c.Name)
		}
	}
	var leases coordinationv1.LeaseList
	if k8s.List(ctx, &leases, client.InNamespace(ns), sel) == nil {
		for _, l := range leases.Items {
			out = append(out, l.Labels[ftv1.LabelPair]+" Lease/"+l.Name)
		}
	}
	return out
}

func (m *monitor) violations() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.bad...)
}

func (m *monitor) stop() { m.cancel(); <-m.done }

var _ = apierrors.IsNotFound
