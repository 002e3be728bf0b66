package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/placement"
)

// placerOn is a Placer over a fake API server holding nodes Ready nodes of the given limit.
func placerOn(t *testing.T, nodes int, limits placement.Limits) (*Placer, client.Client) {
	t.Helper()
	scheme := NewScheme()
	// A plain tracker: the default one manages fields, which fails on KubeVirt's uint64 fields.
	b := fake.NewClientBuilder().WithScheme(scheme).
		WithObjectTracker(clienttesting.NewObjectTracker(scheme, serializer.NewCodecFactory(scheme).UniversalDecoder())).
		WithIndex(&ftv1.FaultTolerantVM{}, indexFTVMProtection, func(o client.Object) []string {
			return []string{string(o.(*ftv1.FaultTolerantVM).Spec.Protection)}
		}).
		WithIndex(&coordinationv1.Lease{}, indexRecordReserves, func(o client.Object) []string { return nil })
	for i := range nodes {
		b = b.WithObjects(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i)},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}})
	}
	c := b.Build()
	return &Placer{Nodes: clientLister{c, &corev1.NodeList{}}, Members: clientLister{c, &virtv1.VirtualMachineInstanceList{}},
		Reader: c, APIReader: c, Defaults: limits, AssumeTTL: time.Minute, Sightings: &Sightings{}}, c
}

// clientLister lists through a fake client, as the informer's store would: an object written is
// listed at once.
type clientLister struct {
	c    client.Reader
	list client.ObjectList
}

// GetByKey gets the object of the list's kind at "namespace/name".
func (l clientLister) GetByKey(key string) (any, bool, error) {
	ns, name, _ := strings.Cut(key, "/")
	scheme := NewScheme()
	gvk, err := apiutil.GVKForObject(l.list, scheme)
	if err != nil {
		return nil, false, err
	}
	o, err := scheme.New(gvk.GroupVersion().WithKind(strings.TrimSuffix(gvk.Kind, "List")))
	if err != nil {
		return nil, false, err
	}
	co := o.(client.Object)
	switch err := l.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, co); {
	case apierrors.IsNotFound(err):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	}
	return co, true, nil
}

func (l clientLister) List() []any {
	list := l.list.DeepCopyObject().(client.ObjectList)
	if err := l.c.List(context.Background(), list); err != nil {
		panic(err)
	}
	objs, err := apimeta.ExtractList(list)
	if err != nil {
		panic(err)
	}
	out := make([]any, len(objs))
	for i := range objs {
		out[i] = objs[i]
	}
	return out
}

// memberVMI is a member as create makes it, pinned to node.
func memberVMI(key types.NamespacedName, pair, role, node string) *virtv1.VirtualMachineInstance {
	return &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
		Labels: map[string]string{ftv1.LabelPair: pair, ftv1.LabelRole: role, ftv1.LabelNode: node}}}
}

// Creates run outside the critical section, so decisions taken while earlier creates are still
// in flight must count them: many primaries placed at once, each create slow, never put more on
// a node than its limit, and exactly as many fit as the nodes hold.
func TestPlacerCountsMembersWhoseCreateIsInFlight(t *testing.T) {
	const nodes, perNode, vms = 3, 2, 10
	p, c := placerOn(t, nodes, placement.Limits{MaxMembers: perNode, MaxVCPUs: 100})
	ctx := context.Background()
	var mu sync.Mutex
	perNodeCount := map[string]int{}
	placed, refused := 0, 0
	var wg sync.WaitGroup
	for i := range vms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("vm-%d", i)
			key := types.NamespacedName{Namespace: "ns", Name: name + "-1"}
			req := placement.Request{Pair: "ns/" + name, Role: placement.Primary, VCPUs: 1}
			_, err := p.PlaceAndCreate(ctx, req, &virtv1.VirtualMachineInstanceSpec{}, "", key, func(node string) error {
				time.Sleep(20 * time.Millisecond) // the decisions of the others run meanwhile
				mu.Lock()
				perNodeCount[node]++
				mu.Unlock()
				return c.Create(ctx, memberVMI(key, name, ftv1.RolePrimary, node))
			})
			mu.Lock()
			defer mu.Unlock()
			var none *placement.NoEligibleNodeError
			switch {
			case err == nil:
				placed++
			case errors.As(err, &none):
				refused++
			default:
				t.Errorf("%s: %v", name, err)
			}
		}()
	}
	wg.Wait()
	for node, n := range perNodeCount {
		if n > perNode {
			t.Errorf("%s holds %d members, limit %d", node, n, perNode)
		}
	}
	if placed != nodes*perNode || refused != vms-nodes*perNode {
		t.Errorf("placed %d and refused %d, want %d and %d", placed, refused, nodes*perNode, vms-nodes*perNode)
	}
}

// A member whose create failed holds nothing: its node takes the next one at once.
func TestPlacerForgetsAMemberWhoseCreateFailed(t *testing.T) {
	p, c := placerOn(t, 1, placement.Limits{MaxMembers: 1, MaxVCPUs: 100})
	ctx := context.Background()
	spec := &virtv1.VirtualMachineInstanceSpec{}
	failed := errors.New("the API server said no")
	_, err := p.PlaceAndCreate(ctx, placement.Request{Pair: "ns/a", Role: placement.Primary, VCPUs: 1}, spec, "",
		types.NamespacedName{Namespace: "ns", Name: "a-1"}, func(string) error { return failed })
	if !errors.Is(err, failed) {
		t.Fatalf("got %v, want the create's error", err)
	}
	key := types.NamespacedName{Namespace: "ns", Name: "b-1"}
	node, err := p.PlaceAndCreate(ctx, placement.Request{Pair: "ns/b", Role: placement.Primary, VCPUs: 1}, spec, "", key,
		func(node string) error { return c.Create(ctx, memberVMI(key, "b", ftv1.RolePrimary, node)) })
	if err != nil || node != "node-0" {
		t.Fatalf("got %q, %v; want node-0", node, err)
	}
	// The pair's version: a failed primary leaves neither member counted.
	p2, c2 := placerOn(t, 2, placement.Limits{MaxMembers: 1, MaxVCPUs: 100})
	pk, sk := types.NamespacedName{Namespace: "ns", Name: "c-1"}, types.NamespacedName{Namespace: "ns", Name: "c-2"}
	_, err = p2.PlaceAndCreatePair(ctx, placement.Request{Pair: "ns/c", Role: placement.Primary, VCPUs: 1},
		placement.Request{Pair: "ns/c", Role: placement.Secondary, VCPUs: 1}, spec, "", pk, sk,
		func(string, string) error { return failed }, func(string) error { t.Error("the secondary was created after its primary failed"); return nil })
	if !errors.Is(err, failed) {
		t.Fatalf("got %v, want the create's error", err)
	}
	pp, err := p2.PlaceAndCreatePair(ctx, placement.Request{Pair: "ns/d", Role: placement.Primary, VCPUs: 1},
		placement.Request{Pair: "ns/d", Role: placement.Secondary, VCPUs: 1}, spec, "",
		types.NamespacedName{Namespace: "ns", Name: "d-1"}, types.NamespacedName{Namespace: "ns", Name: "d-2"},
		func(node, _ string) error {
			return c2.Create(ctx, memberVMI(types.NamespacedName{Namespace: "ns", Name: "d-1"}, "d", ftv1.RolePrimary, node))
		},
		func(node string) error {
			return c2.Create(ctx, memberVMI(types.NamespacedName{Namespace: "ns", Name: "d-2"}, "d", ftv1.RoleSecondary, node))
		})
	if err != nil || pp.Primary == "" || pp.Secondary == "" {
		t.Fatalf("got %+v, %v; want both members placed on the two nodes", pp, err)
	}
}

// TestUnderCOLOOnlyNodesWithLockstepdTakeMembers: with RequireLockstepd (--colo), a node whose
// lockstepd has not published its logging address is unavailable to placement, and says why;
// once it has, it takes members. Without COLO every Ready node does.
func TestUnderCOLOOnlyNodesWithLockstepdTakeMembers(t *testing.T) {
	p, c := placerOn(t, 2, placement.Limits{MaxMembers: 4, MaxVCPUs: 8})
	ctx := context.Background()
	var n corev1.Node
	if err := c.Get(ctx, types.NamespacedName{Name: "node-1"}, &n); err != nil {
		t.Fatal(err)
	}
	n.Annotations = map[string]string{ftv1.AnnotationNodeLoggingAddress: "10.0.0.2:7000"}
	if err := c.Update(ctx, &n); err != nil {
		t.Fatal(err)
	}
	for _, colo := range []bool{false, true} {
		p.RequireLockstepd = colo
		nodes, err := p.view(ctx, &virtv1.VirtualMachineInstanceSpec{}, "")
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, pn := range nodes {
			got[pn.Name] = pn.Unavailable
		}
		if got["node-1"] != "" {
			t.Errorf("COLO %v: node-1, where lockstepd runs, is unavailable: %q", colo, got["node-1"])
		}
		if unavailable := got["node-0"] != ""; unavailable != colo || (colo && !strings.Contains(got["node-0"], "lockstepd does not run there")) {
			t.Errorf("COLO %v: node-0, without lockstepd: %q", colo, got["node-0"])
		}
	}

	// lockstepd on node-1 renews its node lease: it runs there while the lease is current, and
	// not once it ran out (lockstepd died: its address stays on the Node).
	p.RequireLockstepd, p.LockstepdNamespace, p.Leases = true, "lockstep-system", clientLister{c, &coordinationv1.LeaseList{}}
	renewed := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "lockstep-system", Name: ftv1.NodeLeaseName("node-1"),
		Labels: map[string]string{ftv1.LabelManagedBy: ftv1.ManagedByValue, ftv1.LabelComponent: ftv1.ComponentLockstepd}}, // as lockstepd labels it: the operator's cache holds only such
		Spec: coordinationv1.LeaseSpec{RenewTime: &renewed, LeaseDurationSeconds: ptr.To(int32(ftv1.NodeLeaseDurationSeconds))}}
	if err := c.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	node1 := func() string {
		nodes, err := p.view(ctx, &virtv1.VirtualMachineInstanceSpec{}, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, pn := range nodes {
			if pn.Name == "node-1" {
				return pn.Unavailable
			}
		}
		return "missing"
	}
	if got := node1(); got != "" {
		t.Errorf("node-1 with a current lease: %q", got)
	}
	// A renewal whose renew time reads a minute ago (the node's clock is behind) is still one:
	// the operator dates it when it sees it.
	lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-time.Minute)}
	if err := c.Update(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if got := node1(); got != "" {
		t.Errorf("node-1 renewing by a clock a minute behind: %q", got)
	}
	// The operator last saw it renew a minute ago: it ran out.
	p.Sightings = &Sightings{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(lease), lease); err != nil { // as stored: to the microsecond
		t.Fatal(err)
	}
	nodeLeaseSeen(p.Sightings, lease, time.Now().Add(-time.Minute))
	if got := node1(); !strings.Contains(got, "its node lease lockstepd-node-1 ran out") {
		t.Errorf("node-1 whose lease ran out: %q", got)
	}
}
