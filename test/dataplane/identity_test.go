//go:build linux

package dataplane

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/scheme"
)

// TestEachLockstepdSpeaksOnlyForItsOwnNode applies config/lockstepd's RBAC and admission policy
// to the real API server and acts as the lockstepd of one node, with a ServiceAccount token bound
// to its pod (as the kubelet mounts it): the API server lets it change its own Node, the members
// on its node and records that name them, and denies the same writes for another node's, with a
// message that says why; and it writes only its own side's report in a FaultTolerantVM's status. A
// token not bound to a pod is refused.
func TestEachLockstepdSpeaksOnlyForItsOwnNode(t *testing.T) {
	ctx := context.Background()
	for _, ns := range []string{"lockstep-system", "identity"} {
		if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"rbac/service_account.yaml", "rbac/role.yaml", "rbac/role_binding.yaml", "admission-policy.yaml"} {
		applyFile(t, filepath.Join("..", "..", "config", "lockstepd", f))
	}
	own, other := "identity-node-a", "identity-node-b"
	for _, n := range []string{own, other} {
		if err := k8s.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}) })
	}
	lsd, unbound := lockstepdOf(t, "lockstepd-a", own)

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

// lockstepdOf makes the pod of a lockstepd on node, and returns clients of lockstepd's
// ServiceAccount with a token bound to that pod (as the kubelet mounts it) and with one bound to
// nothing.
func lockstepdOf(t *testing.T, podName, node string) (bound, unbound client.Client) {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "lockstep-system", Name: podName},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "lockstepd", Containers: []corev1.Container{{Name: "lockstepd", Image: "lockstepd"}}}}
	if err := k8s.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), pod) })
	cs := kubernetes.NewForConfigOrDie(restCfg)
	as := func(req *authenticationv1.TokenRequest) client.Client {
		tr, err := cs.CoreV1().ServiceAccounts("lockstep-system").CreateToken(ctx, "lockstepd", req, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token request: %v", err)
		}
		cfg := rest.AnonymousClientConfig(restCfg)
		cfg.BearerToken = tr.Status.Token
		c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ref := &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	return as(&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: ref}}), as(&authenticationv1.TokenRequest{})
}

// applyFile applies every object of a YAML file to the API server (server-side apply).
func applyFile(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return
			}
			t.Fatalf("%s: %v", path, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if err := k8s.Apply(context.Background(), client.ApplyConfigurationFromUnstructured(&u), client.FieldOwner("dataplane-test"), client.ForceOwnership); err != nil {
			t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
}
