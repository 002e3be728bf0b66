//go:build scale

package scale

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/controllers"
	"github.com/lockstep-dev/lockstep/internal/health"
	"github.com/lockstep-dev/lockstep/internal/member"
	"github.com/lockstep-dev/lockstep/internal/placement"
)

// monitor follows every member VMI and node through watches and records each broken invariant
// the moment it shows: a node above its FT limit, two members of a pair on one node, two members
// of a pair labelled primary.
type monitor struct {
	// cache also holds the FaultTolerantVMs, which the run polls often without loading the API
	// server with lists of a thousand of them.
	cache cache.Cache

	mu       sync.Mutex
	members  map[string]memberView // namespace/name
	nodes    map[string]nodeRoom   // limits and whether it takes members; usage is summed on demand
	closedAt map[string]time.Time  // when each node that takes no members was seen to stop
	// downSince is when each node that is not Ready stopped being Ready, by its Ready condition:
	// where the operator's node-lost grace starts.
	downSince   map[string]time.Time
	protected   map[string]bool      // each FaultTolerantVM's state is Protected, by namespace/name
	protectedAt map[string]time.Time // when it last became Protected, as the watch showed it
	bad         []string
	phase       string
}

type memberView struct {
	pair, node, role string
	vcpus            int
	active           bool // not finished: it holds its node's capacity (also while being deleted)
}

func startMonitor(ctx context.Context, cfg *rest.Config) (*monitor, error) {
	c, err := cache.New(cfg, cache.Options{Scheme: controllers.NewScheme()})
	if err != nil {
		return nil, err
	}
	m := &monitor{cache: c, members: map[string]memberView{}, nodes: map[string]nodeRoom{}, closedAt: map[string]time.Time{},
		downSince: map[string]time.Time{}, protected: map[string]bool{}, protectedAt: map[string]time.Time{}}
	ftvms, err := c.GetInformer(ctx, &ftv1.FaultTolerantVM{})
	if err != nil {
		return nil, err
	}
	if _, err := ftvms.AddEventHandler(handler(m.ftvm)); err != nil {
		return nil, err
	}
	vmis, err := c.GetInformer(ctx, &virtv1.VirtualMachineInstance{})
	if err != nil {
		return nil, err
	}
	nodes, err := c.GetInformer(ctx, &corev1.Node{})
	if err != nil {
		return nil, err
	}
	if _, err := vmis.AddEventHandler(handler(m.vmi)); err != nil {
		return nil, err
	}
	if _, err := nodes.AddEventHandler(handler(m.node)); err != nil {
		return nil, err
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		return nil, fmt.Errorf("the monitor's cache did not sync")
	}
	return m, nil
}

// handler calls on with each object's latest state, or with gone set once it is deleted.
func handler[T any](on func(obj T, gone bool)) toolscache.ResourceEventHandlerFuncs {
	call := func(o any, gone bool) {
		if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		if t, ok := o.(T); ok {
			on(t, gone)
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { call(o, false) },
		UpdateFunc: func(_, o any) { call(o, false) },
		DeleteFunc: func(o any) { call(o, true) },
	}
}

func (m *monitor) vmi(v *virtv1.VirtualMachineInstance, gone bool) {
	if v.Labels[ftv1.LabelPair] == "" {
		return
	}
	key := v.Namespace + "/" + v.Name
	m.mu.Lock()
	defer m.mu.Unlock()
	if gone {
		delete(m.members, key)
		return
	}
	mv := memberView{pair: v.Namespace + "/" + v.Labels[ftv1.LabelPair], node: v.Labels[ftv1.LabelNode],
		role: v.Labels[ftv1.LabelRole], vcpus: member.VCPUs(&v.Spec), active: !v.IsFinal()}
	m.members[key] = mv
	m.checkNode(mv.node)
	m.checkPair(mv.pair)
}

func (m *monitor) node(n *corev1.Node, gone bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if gone {
		delete(m.nodes, n.Name)
		return
	}
	l, _ := member.NodeLimits(placement.Limits{MaxMembers: defaultMaxMembers, MaxVCPUs: defaultMaxVCPUs}, n)
	r := nodeRoom{Name: n.Name, Open: nodeOpen(n), MaxMembers: l.MaxMembers, MaxVCPUs: l.MaxVCPUs}
	switch {
	case r.Open:
		delete(m.closedAt, n.Name)
	case m.nodes[n.Name].Open || m.closedAt[n.Name].IsZero():
		m.closedAt[n.Name] = time.Now()
	}
	delete(m.downSince, n.Name)
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			m.downSince[n.Name] = c.LastTransitionTime.Time
		}
	}
	m.nodes[n.Name] = r
	m.checkNode(n.Name)
}

// nodeOpen: the operator may place a member there (the scale run's VMs tolerate no taint).
func nodeOpen(n *corev1.Node) bool {
	return health.NodeAvailable(n, func(*corev1.Taint) bool { return false }) == ""
}

// checkNode records the node above its limit (m.mu held).
func (m *monitor) checkNode(name string) {
	r, ok := m.nodes[name]
	if !ok {
		return
	}
	members, vcpus := 0, 0
	for _, mv := range m.members {
		if mv.node == name && mv.active {
			members++
			vcpus += mv.vcpus
		}
	}
	if members > r.MaxMembers || vcpus > r.MaxVCPUs {
		m.failLocked("node %s holds %d members and %d vCPUs, above its FT limit of %d and %d", name, members, vcpus, r.MaxMembers, r.MaxVCPUs)
	}
}

// checkPair records two members of the pair on one node, or two labelled primary (m.mu held).
func (m *monitor) checkPair(pair string) {
	var primaries []string
	on := map[string]string{}
	for key, mv := range m.members {
		if mv.pair != pair || !mv.active {
			continue
		}
		if mv.role == ftv1.RolePrimary {
			primaries = append(primaries, key)
		}
		if other, ok := on[mv.node]; ok && mv.node != "" {
			m.failLocked("members %s and %s of one pair on node %s", other, key, mv.node)
		}
		on[mv.node] = key
	}
	if len(primaries) > 1 {
		sort.Strings(primaries)
		m.failLocked("two members of one pair labelled primary at once: %v", primaries)
	}
}

func (m *monitor) failLocked(format string, args ...any) {
	msg := fmt.Sprintf("[%s] ", m.phase) + fmt.Sprintf(format, args...)
	for _, b := range m.bad {
		if b == msg {
			return
		}
	}
	m.bad = append(m.bad, msg)
}

func (m *monitor) setPhase(p string) {
	m.mu.Lock()
	m.phase = p
	m.mu.Unlock()
}

func (m *monitor) violations() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.bad...)
}

// rooms is every node with what its members use now.
func (m *monitor) rooms() []nodeRoom {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]nodeRoom, 0, len(m.nodes))
	use := map[string][2]int{}
	for _, mv := range m.members {
		if mv.active {
			u := use[mv.node]
			use[mv.node] = [2]int{u[0] + 1, u[1] + mv.vcpus}
		}
	}
	for _, r := range m.nodes {
		r.Members, r.VCPUs = use[r.Name][0], use[r.Name][1]
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ftvm notes when each FaultTolerantVM becomes Protected.
func (m *monitor) ftvm(f *ftv1.FaultTolerantVM, gone bool) {
	key := f.Namespace + "/" + f.Name
	m.mu.Lock()
	defer m.mu.Unlock()
	now := !gone && f.Status.State == ftv1.StateProtected
	if now && !m.protected[key] {
		m.protectedAt[key] = time.Now()
	}
	m.protected[key] = now
}

// lastProtected is when the FaultTolerantVM namespace/name last became Protected; zero while it
// is not.
func (m *monitor) lastProtected(key string) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.protected[key] {
		return time.Time{}
	}
	return m.protectedAt[key]
}

// notReadySince is when the node stopped being Ready, by its Ready condition; zero while Ready.
func (m *monitor) notReadySince(name string) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.downSince[name]
}

// closedSince is when the monitor saw the node stop taking members; zero while it takes them.
func (m *monitor) closedSince(name string) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closedAt[name]
}

// open says whether the node takes members, as the monitor last saw it.
func (m *monitor) open(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.nodes[name].Open
}
