//go:build linux

package dataplane

import (
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/test/apitest"
)

// TestEachLockstepdSpeaksOnlyForItsOwnNode applies config/lockstepd's RBAC and admission policy
// to the real API server and acts as the lockstepd of one node, with a ServiceAccount token bound
// to its pod (as the kubelet mounts it): the API server lets it change its own Node, the members
// on its node and records that name them (only members the operator listed on the record as
// placed on its node), and denies the same writes for another node's, with a
// message that says why; and it writes only its own side's report in a FaultTolerantVM's status. A
// token not bound to a pod is refused.
func TestEachLockstepdSpeaksOnlyForItsOwnNode(t *testing.T) {
	ctx := context.Background()
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "identity"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	apitest.InstallIdentities(t, k8s, root)
	own, other := "identity-node-a", "identity-node-b"
	for _, n := range []string{own, other} {
		if err := k8s.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}) })
	}
	boundToken, unboundToken := apitest.LockstepdPod(t, restCfg, k8s, own)
	lsd, unbound := apitest.As(t, restCfg, boundToken), apitest.As(t, restCfg, unboundToken)

	vmis := map[string]*virtv1.VirtualMachineInstance{}
	for _, n := range []string{own, other} {
		v := &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "identity", Name: "vm-on-" + n, Labels: map[string]string{ftv1.LabelPair: "vm"}},
			Status: virtv1.VirtualMachineInstanceStatus{Phase: virtv1.Running, NodeName: n}}
		if err := k8s.Create(ctx, v); err != nil {
			t.Fatal(err)
		}
		vmis[n] = v
	}
	annotate := func(key, value string) client.Patch {
		return client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+key+`":"`+value+`"}}}`))
	}
	lease := func(holder string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "identity", Name: "ft-" + strings.ReplaceAll(holder, "/", "-")},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}
	}
	denied := func(what, want string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want it denied with %q", what, err, want)
		}
	}

	// The policy takes a moment to be in force after it is created.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := lsd.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: other}}, annotate(ftv1.AnnotationNodeLoggingAddress, "10.9.9.9:7410"))
		if err != nil {
			denied("another node's Node", "may change only its own Node", err)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lockstepd of one node changed another node's Node 30s after the policy was created")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := lsd.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: own}}, annotate(ftv1.AnnotationNodeLoggingAddress, "10.9.9.1:7410")); err != nil {
		t.Errorf("its own Node: %v", err)
	}
	if err := lsd.Patch(ctx, vmis[own], annotate(ftv1.AnnotationSyncedAt, "now")); err != nil {
		t.Errorf("a member on its node: %v", err)
	}
	denied("a member on another node", "only the members that run on its node", lsd.Patch(ctx, vmis[other], annotate(ftv1.AnnotationSyncedAt, "now")))
	denied("deleting a member on another node", "only the members that run on its node", lsd.Delete(ctx, vmis[other]))
	if err := lsd.Delete(ctx, vmis[own]); err != nil {
		t.Errorf("deleting a fenced member on its node: %v", err)
	}
	if err := lsd.Create(ctx, lease(own+"/vm-on-a")); err != nil {
		t.Errorf("a record naming a member of its node: %v", err)
	}
	denied("a record naming another node's member", "only a member of its own node", lsd.Create(ctx, lease(other+"/vm-on-b")))
	// A record naming the other node's member (its primary): this node's lockstepd, the
	// secondary's, renews it as itself, and may not move its holder or epoch.
	theirs := lease(other + "/vm-on-b")
	theirs.Spec.LeaseTransitions = new(int32(2))
	if err := k8s.Create(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	renew := func(by string, epoch int32, holder string) error {
		l := &coordinationv1.Lease{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(theirs), l); err != nil {
			return err
		}
		l.Spec.RenewTime, l.Spec.LeaseTransitions, l.Spec.HolderIdentity = &metav1.MicroTime{Time: time.Now()}, &epoch, &holder
		l.Annotations = map[string]string{ftv1.AnnotationRenewedBy: by}
		return lsd.Update(ctx, l)
	}
	if err := renew(own+"/vm-on-a", 2, other+"/vm-on-b"); err != nil {
		t.Errorf("renewing its primary's record as itself: %v", err)
	}
	denied("renewing another node's record in another's name", "only a member of its own node", renew(other+"/vm-on-b", 2, other+"/vm-on-b"))
	denied("moving another node's record to another epoch", "only a member of its own node", renew(own+"/vm-on-a", 3, other+"/vm-on-b"))
	denied("changing the holder of another node's record", "only a member of its own node", renew(own+"/vm-on-a", 2, other+"/vm-x"))
	// A record whose members the operator listed (ft.lockstep.dev/members): a lockstepd moves it
	// only to a listed member of its own node, and never changes the list.
	listed := lease(other + "/vm-on-b")
	listed.Name = "ft-listed"
	listed.Spec.LeaseTransitions = new(int32(4))
	listed.Annotations = map[string]string{ftv1.AnnotationMembers: other + "/vm-on-b," + own + "/vm-on-a"}
	if err := k8s.Create(ctx, listed); err != nil {
		t.Fatal(err)
	}
	claim := func(holder string, edit func(map[string]string)) error {
		l := &coordinationv1.Lease{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(listed), l); err != nil {
			return err
		}
		l.Spec.HolderIdentity, l.Spec.LeaseTransitions = &holder, new(*l.Spec.LeaseTransitions+1)
		l.Annotations[ftv1.AnnotationRenewedBy] = holder
		if edit != nil {
			edit(l.Annotations)
		}
		return lsd.Update(ctx, l)
	}
	denied("naming, with its own node, a member the operator placed on another", "only a member the operator placed on its node",
		claim(own+"/vm-on-b", nil))
	denied("naming a member of its node the operator did not list", "only a member the operator placed on its node",
		claim(own+"/vm-stray", nil))
	denied("listing a member of its own", "may not change the members listed", claim(own+"/vm-on-a", func(a map[string]string) {
		a[ftv1.AnnotationMembers] += "," + own + "/vm-stray"
	}))
	denied("removing the list", "may not change the members listed", claim(own+"/vm-on-a", func(a map[string]string) {
		delete(a, ftv1.AnnotationMembers)
	}))
	if err := claim(own+"/vm-on-a", nil); err != nil {
		t.Errorf("claiming a record for the member the operator listed on its node: %v", err)
	}

	// Its node lease (lockstepd-<node>), which says that lockstepd runs on the node: its own only.
	nodeLease := func(node string) *coordinationv1.Lease {
		holder := ftv1.SideIdentity(own, ftv1.NodeLeaseHolderSuffix) // a holder the record rule lets through
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "identity", Name: ftv1.NodeLeaseName(node)},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}
	}
	if err := lsd.Create(ctx, nodeLease(own)); err != nil {
		t.Errorf("its own node lease: %v", err)
	}
	denied("another node's node lease", "may renew only its own node lease", lsd.Create(ctx, nodeLease(other)))

	// A FaultTolerantVM's status: a lockstepd writes the report of a side on its node only.
	guest := resource.MustParse("64Mi")
	ftvm := &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Namespace: "identity", Name: "vm"}, Spec: ftv1.FaultTolerantVMSpec{
		LoggingNetwork: ftv1.LoggingNetwork{Name: "ft-logging"},
		Template: ftv1.VMITemplate{Spec: virtv1.VirtualMachineInstanceSpec{Domain: virtv1.DomainSpec{
			CPU: &virtv1.CPU{Cores: 1}, Memory: &virtv1.Memory{Guest: &guest}}}},
	}}
	if err := k8s.Create(ctx, ftvm); err != nil {
		t.Fatal(err)
	}
	report := func(side, node string) client.Patch {
		return client.RawPatch(types.MergePatchType, []byte(`{"status":{"replication":{"`+side+`":{"vmi":"vm-on-`+node+`","node":"`+node+`","state":"Protected","reportTime":"2026-11-23T00:00:00Z"}}}}`))
	}
	if err := lsd.Status().Patch(ctx, ftvm, report("primary", own)); err != nil {
		t.Errorf("the report of the side on its node: %v", err)
	}
	denied("the report of a side on another node", "only the report of a side on its node", lsd.Status().Patch(ctx, ftvm, report("secondary", other)))
	if err := k8s.Status().Patch(ctx, ftvm, report("secondary", other)); err != nil {
		t.Fatal(err) // as the other node's lockstepd would
	}
	if err := lsd.Status().Patch(ctx, ftvm, report("primary", own)); err != nil {
		t.Errorf("its own report again, beside the other node's: %v", err)
	}

	denied("a token not bound to its pod", "bound to its pod", unbound.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: own}}, annotate(ftv1.AnnotationNodeLoggingAddress, "10.9.9.1:7410")))
}
