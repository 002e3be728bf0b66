package controllers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/health"
	"github.com/lockstep-dev/lockstep/internal/kubevirtsize"
	"github.com/lockstep-dev/lockstep/internal/member"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/placement"
)

// Placer chooses nodes for new members, one decision at a time, and creates them.
//
// The FT limit must hold while many FaultTolerantVMs reconcile at once and while the informer
// cache trails the API server. So each decision is a critical section: the Placer holds a mutex
// while it reads the cluster and chooses, and before it lets go it assumes the member on its
// node (an assume cache, as in kube-scheduler). It remembers the member until the cache shows it,
// or until its create fails. Every decision therefore counts every earlier one, while the
// creates themselves, a few API requests each, run outside the mutex and side by side. The
// operator runs with leader election, so one Placer decides for the cluster. Members are pinned
// to their node and carry required anti-affinity, so the scheduler enforces the same decision.
type Placer struct {
	// Nodes and Members list the informer cache's nodes and member VMIs, every decision.
	Nodes, Members Lister
	// Reader is the cache, for the few other objects a decision reads through an index.
	Reader client.Reader
	// APIReader reads the API server directly, to tell a created member the cache does not show
	// yet from one that is already gone again.
	APIReader client.Reader
	Defaults  placement.Limits
	// RequireLockstepd takes only nodes where lockstepd runs (it published its logging address
	// and renews its node lease, in LockstepdNamespace): a COLO member's state reaches it only
	// through lockstepd, and a secondary placed elsewhere would hold nothing. Leases is the
	// cache's store of leases, where a decision reads each node's lease without a copy.
	RequireLockstepd   bool
	LockstepdNamespace string
	Leases             KeyGetter
	// AssumeTTL bounds how long a created member that the cache never shows is remembered.
	AssumeTTL time.Duration
	// Requests is what the pods bound to each node request: with the node's allocatable CPU and
	// memory, the room the scheduler will see there. Nil: resources are not counted.
	Requests *NodeRequests
	// Sightings dates the node leases' renewals on the operator's clock (shared with the
	// reconciler).
	Sightings *Sightings
	// Sizing is the KubeVirt configuration that sizes members' launcher pods (shared with the
	// reconciler, which sizes the members it is about to place).
	Sizing *KubeVirtSizing

	mu      sync.Mutex
	assumed map[types.NamespacedName]assumedMember
}

// Lister lists the objects of one kind that an informer holds: its own, not copies (client-go's
// cache.Store). They are shared, so they are only read. Placement reads every node and member on
// every decision, and a List through the cache copies each into a new list: at 500 nodes and
// 2,000 members that was over a third of what the operator allocated (make bench-scale).
type Lister interface {
	List() []any
}

// KeyGetter gets one object of an informer's own by its "namespace/name" key, shared too.
type KeyGetter interface {
	GetByKey(key string) (item any, exists bool, err error)
}

// Store is an informer's store: its objects, listed or by key.
type Store interface {
	Lister
	KeyGetter
}

// InformerLister is the Store of the cache's informer for obj's kind.
func InformerLister(ctx context.Context, c cache.Informers, obj client.Object) (Store, error) {
	inf, err := c.GetInformer(ctx, obj)
	if err != nil {
		return nil, err
	}
	l, ok := inf.(interface{ GetStore() toolscache.Store })
	if !ok {
		return nil, fmt.Errorf("the cache's informer for %T (%T) has no store to list", obj, inf)
	}
	return l.GetStore(), nil
}

type assumedMember struct {
	node   string
	member placement.Member
	at     time.Time
	// creating: its create is in flight, so it is counted as it is.
	creating bool
}

// PlaceAndCreate finds a node for req among the nodes that fit the VM's scheduling constraints,
// and calls create with it. It returns the node, or a *placement.NoEligibleNodeError.
func (p *Placer) PlaceAndCreate(ctx context.Context, req placement.Request, vm *virtv1.VirtualMachineInstanceSpec,
	topologyKey string, key types.NamespacedName, create func(node string) error) (string, error) {
	var node string
	err := p.decide(ctx, vm, topologyKey, func(nodes []placement.Node) error {
		var err error
		if node, err = placement.Place(nodes, req); err != nil {
			p.noNode(ctx, nodes, req)
			return err
		}
		p.assume(key, node, req)
		return nil
	})
	if err != nil {
		return "", err
	}
	err = create(node)
	p.createDone(key, err)
	if err != nil {
		return "", err
	}
	return node, nil
}

// Fits says whether a member of req could be placed now: nil, or a *placement.NoEligibleNodeError
// that says why not for each node. It decides nothing and assumes nothing.
func (p *Placer) Fits(ctx context.Context, req placement.Request, vm *virtv1.VirtualMachineInstanceSpec, topologyKey string) error {
	return p.decide(ctx, vm, topologyKey, func(nodes []placement.Node) error {
		if _, err := placement.Place(nodes, req); err != nil {
			p.noNode(ctx, nodes, req)
			return err
		}
		return nil
	})
}

// PlaceAndCreatePair places both members of a new pair in one decision (placement.PlacePair)
// and creates them, primary first. Placement.Secondary is "" when only the primary could be
// placed (SecondaryErr says why) or when creating the secondary failed (the error says why); the
// primary was created whenever Placement.Primary is set.
func (p *Placer) PlaceAndCreatePair(ctx context.Context, primary, secondary placement.Request, vm *virtv1.VirtualMachineInstanceSpec,
	topologyKey string, primaryKey, secondaryKey types.NamespacedName, createPrimary func(node, secondaryNode string) error,
	createSecondary func(node string) error) (placement.PairPlacement, error) {
	var pp placement.PairPlacement
	err := p.decide(ctx, vm, topologyKey, func(nodes []placement.Node) error {
		var err error
		if pp, err = placement.PlacePair(nodes, primary, secondary, topologyKey != ""); err != nil {
			p.noNode(ctx, nodes, primary)
			return err
		}
		if pp.SecondaryErr != nil {
			p.noNode(ctx, nodes, secondary)
		}
		p.assume(primaryKey, pp.Primary, primary)
		if pp.Secondary != "" {
			p.assume(secondaryKey, pp.Secondary, secondary)
		}
		return nil
	})
	if err != nil {
		return placement.PairPlacement{}, err
	}
	err = createPrimary(pp.Primary, pp.Secondary)
	p.createDone(primaryKey, err)
	if err != nil {
		p.createDone(secondaryKey, err) // never created
		return placement.PairPlacement{}, err
	}
	if pp.Secondary == "" {
		return pp, nil
	}
	err = createSecondary(pp.Secondary)
	p.createDone(secondaryKey, err)
	if err != nil {
		pp.Secondary = ""
		return pp, err
	}
	return pp, nil
}

// decide runs choose on the cluster as placement sees it, inside the critical section; choose
// assumes what it places.
func (p *Placer) decide(ctx context.Context, vm *virtv1.VirtualMachineInstanceSpec, topologyKey string,
	choose func([]placement.Node) error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	nodes, err := p.view(ctx, vm, topologyKey)
	if err != nil {
		return err
	}
	return choose(nodes)
}

// createDone settles an assumed member once its create returned: it is counted until the cache
// shows it, or forgotten when it was not created.
func (p *Placer) createDone(key types.NamespacedName, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a, ok := p.assumed[key]
	switch {
	case !ok: // the cache shows it already
	case err != nil:
		delete(p.assumed, key)
	default:
		a.creating, a.at = false, time.Now()
		p.assumed[key] = a
	}
}

// assume counts a member placed on node from the decision on, while it is created.
func (p *Placer) assume(key types.NamespacedName, node string, req placement.Request) {
	if p.assumed == nil {
		p.assumed = map[types.NamespacedName]assumedMember{}
	}
	p.assumed[key] = assumedMember{node: node, at: time.Now(), creating: true, member: req.Member()}
}

// noNode counts a placement that found no node and logs, at debug level, what each node held.
func (p *Placer) noNode(ctx context.Context, nodes []placement.Node, req placement.Request) {
	metrics.PlacementFailures.WithLabelValues(string(req.Role)).Inc()
	logger := logr.FromContextOrDiscard(ctx).V(1)
	if !logger.Enabled() {
		return
	}
	held := map[string][]string{}
	for _, n := range nodes {
		for _, m := range n.Members {
			held[n.Name] = append(held[n.Name], m.Pair+"/"+string(m.Role))
		}
	}
	logger.Info("no eligible node", "pair", req.Pair, "role", req.Role, "members", held, "assumed", p.assumedKeys())
}

// assumedKeys lists the members created but not yet seen in the cache, for debugging.
func (p *Placer) assumedKeys() []string {
	keys := make([]string, 0, len(p.assumed))
	for k, a := range p.assumed {
		keys = append(keys, k.String()+"@"+a.node)
	}
	return keys
}

// view is the cluster as placement sees it: every node with its FT limits, whether the VM may run
// there, and the members on it, including the ones created but not yet in the cache.
func (p *Placer) view(ctx context.Context, vm *virtv1.VirtualMachineInstanceSpec, topologyKey string) ([]placement.Node, error) {
	if p.Requests != nil && !p.Requests.HasSynced() {
		return nil, errors.New("the pods bound to the nodes are not all counted yet")
	}
	alone, err := p.pairsAlone(ctx)
	if err != nil {
		return nil, err
	}
	sizing := p.Sizing.Cluster(ctx)
	seen := map[types.NamespacedName]bool{}
	byNode := map[string][]placement.Member{}
	primaryOf, hasSecondary := map[string]placement.Member{}, map[string]bool{}
	for _, o := range p.Members.List() {
		v, ok := o.(*virtv1.VirtualMachineInstance)
		if !ok || v.Labels[ftv1.LabelNode] == "" {
			continue
		}
		seen[client.ObjectKeyFromObject(v)] = true
		if v.IsFinal() {
			continue // its pod is gone: it holds nothing
		}
		m := memberOf(ctx, v, sizing)
		m.PodCounted = p.Requests != nil && p.Requests.LauncherBound(v.UID)
		switch m.Role {
		case placement.Primary:
			m.Alone = alone[m.Pair]
			primaryOf[m.Pair] = m
		case placement.Secondary:
			hasSecondary[m.Pair] = true
		}
		byNode[v.Labels[ftv1.LabelNode]] = append(byNode[v.Labels[ftv1.LabelNode]], m)
	}
	if err := p.addReservations(ctx, byNode, primaryOf, hasSecondary); err != nil {
		return nil, err
	}
	for k, a := range p.assumed {
		switch {
		case seen[k]:
			delete(p.assumed, k) // the cache counts it now
			continue
		case time.Since(a.at) > p.AssumeTTL:
			delete(p.assumed, k) // never shown, or a create that never returned
			continue
		case a.creating: // counted as it is until its create returns
		default:
			err := p.APIReader.Get(ctx, k, &virtv1.VirtualMachineInstance{})
			if apierrors.IsNotFound(err) {
				delete(p.assumed, k) // created and deleted before the cache saw it
				continue
			}
			if err != nil {
				return nil, err
			}
		}
		byNode[a.node] = append(byNode[a.node], a.member)
	}

	fits := vmSchedulingFilter(vm)
	nodes := p.Nodes.List()
	out := make([]placement.Node, 0, len(nodes))
	for _, o := range nodes {
		if n, ok := o.(*corev1.Node); ok {
			out = append(out, p.nodeOf(ctx, n, byNode[n.Name], fits, topologyKey))
		}
	}
	metrics.ObserveNodes(out)
	return out, nil
}

// nodeOf is node n as placement sees it, holding members.
func (p *Placer) nodeOf(ctx context.Context, n *corev1.Node, members []placement.Member, fits func(*corev1.Node) string, topologyKey string) placement.Node {
	pn := placement.Node{Name: n.Name, Limits: p.limitsOf(ctx, n), Members: members, Unavailable: fits(n)}
	if p.Requests != nil {
		pn.Allocatable = placement.Resources{MilliCPU: n.Status.Allocatable.Cpu().MilliValue(), MemoryBytes: n.Status.Allocatable.Memory().Value()}
		pn.Requested = p.Requests.Requested(n.Name)
	}
	if pn.Unavailable == "" && p.RequireLockstepd {
		now := time.Now()
		lease := p.nodeLease(ctx, n.Name)
		if running, expired := health.Lockstepd(n, lease, nodeLeaseSeen(p.Sightings, lease, now), now); !running {
			pn.Unavailable = "lockstepd does not run there (the node has no " + ftv1.AnnotationNodeLoggingAddress + " annotation), and a COLO member needs it"
			if !expired.IsZero() {
				pn.Unavailable = "lockstepd does not run there (its node lease " + ftv1.NodeLeaseName(n.Name) + " ran out at " +
					expired.UTC().Format(time.RFC3339) + "), and a COLO member needs it"
			}
		}
	}
	if topologyKey != "" {
		pn.Domain = n.Labels[topologyKey]
	}
	return pn
}

// nodeLease is lockstepd's lease on node in the cache's store, or nil when there is none or the
// store cannot say (then the node's address alone says whether lockstepd runs, as without a
// lease: see lockstepdOn).
func (p *Placer) nodeLease(ctx context.Context, node string) *coordinationv1.Lease {
	if p.Leases == nil {
		return nil
	}
	item, exists, err := p.Leases.GetByKey(p.LockstepdNamespace + "/" + ftv1.NodeLeaseName(node))
	if err != nil {
		log.FromContext(ctx).V(1).Info("reading a node lease", "node", node, "err", err.Error())
		return nil
	}
	if !exists {
		return nil
	}
	lease, _ := item.(*coordinationv1.Lease)
	return lease
}

// pairsAlone are the pairs whose protection is Disabled: no secondary is held for them.
func (p *Placer) pairsAlone(ctx context.Context) (map[string]bool, error) {
	var ftvms ftv1.FaultTolerantVMList
	if err := p.Reader.List(ctx, &ftvms, client.MatchingFields{indexFTVMProtection: string(ftv1.ProtectionDisabled)}); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for i := range ftvms.Items {
		out[pairKey(ftvms.Items[i].Namespace, ftvms.Items[i].Name)] = true
	}
	return out, nil
}

// addReservations counts the reserved node of each pair whose protection is suspended (its
// record's reserved node, while the pair has no secondary), sized as its primary.
func (p *Placer) addReservations(ctx context.Context, byNode map[string][]placement.Member, primaryOf map[string]placement.Member, hasSecondary map[string]bool) error {
	var leases coordinationv1.LeaseList
	if err := p.Reader.List(ctx, &leases, client.MatchingLabels{ftv1.LabelManagedBy: ftv1.ManagedByValue}, client.MatchingFields{indexRecordReserves: "true"}); err != nil {
		return err
	}
	for i := range leases.Items {
		l := &leases.Items[i]
		node := l.Annotations[ftv1.AnnotationReservedNode]
		pair := pairKey(l.Namespace, l.Labels[ftv1.LabelPair])
		prim, ok := primaryOf[pair]
		if node == "" || !ok || hasSecondary[pair] {
			continue
		}
		byNode[node] = append(byNode[node], placement.Member{Pair: pair, Role: placement.Secondary, VCPUs: prim.VCPUs,
			LogBandwidthMbps: prim.LogBandwidthMbps, Requests: prim.Requests, Reserved: true})
	}
	return nil
}

// pairKey names a pair across namespaces: two FaultTolerantVMs may share a name.
func pairKey(namespace, name string) string {
	return namespace + "/" + name
}

// memberOf is a member VMI as placement counts it: its launcher pod sized as KubeVirt, configured
// as sizing says, sizes it.
func memberOf(ctx context.Context, v *virtv1.VirtualMachineInstance, sizing kubevirtsize.Cluster) placement.Member {
	bw, _ := strconv.Atoi(v.Annotations[ftv1.AnnotationReservedLogBandwidth])
	cpu, memory, err := kubevirtsize.LauncherRequests(v, sizing)
	if err != nil {
		log.FromContext(ctx).V(1).Info("a member's launcher cannot be sized", "vmi", v.Name, "err", err.Error())
	}
	return placement.Member{
		Pair:             pairKey(v.Namespace, v.Labels[ftv1.LabelPair]),
		Role:             placement.Role(v.Labels[ftv1.LabelRole]),
		VCPUs:            member.VCPUs(&v.Spec),
		LogBandwidthMbps: bw,
		Requests:         placement.Resources{MilliCPU: cpu, MemoryBytes: memory},
	}
}

// limitsOf is the node's FT limit: the cluster default unless the node's annotations override it.
func (p *Placer) limitsOf(ctx context.Context, n *corev1.Node) placement.Limits {
	l, ignored := member.NodeLimits(p.Defaults, n)
	for _, key := range ignored {
		logr.FromContextOrDiscard(ctx).Info("ignoring invalid FT limit annotation", "node", n.Name, "annotation", key, "value", n.Annotations[key])
	}
	return l
}

// vmSchedulingFilter says why the VM cannot run on a node ("" when it can): node readiness,
// cordon, taints it does not tolerate, and its own node selector and node affinity.
func vmSchedulingFilter(vm *virtv1.VirtualMachineInstanceSpec) func(*corev1.Node) string {
	pod := &corev1.Pod{Spec: corev1.PodSpec{NodeSelector: vm.NodeSelector, Affinity: vm.Affinity}}
	required := nodeaffinity.GetRequiredNodeAffinity(pod)
	tolerates := func(t *corev1.Taint) bool {
		for i := range vm.Tolerations {
			if vm.Tolerations[i].ToleratesTaint(logr.Discard(), t, false) {
				return true
			}
		}
		return false
	}
	return func(n *corev1.Node) string {
		if why := health.NodeAvailable(n, tolerates); why != "" {
			return why
		}
		if ok, _ := required.Match(n); !ok {
			return "does not match the VM's node selector or affinity"
		}
		return ""
	}
}
