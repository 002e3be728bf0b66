package apitest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/lockstep-dev/lockstep/controllers"
	"github.com/lockstep-dev/lockstep/internal/scheme"
)

// Namespace is where the install puts the operator and lockstepd.
const Namespace = "lockstep-system"

// CA is the lockstepd CA's Secret and ConfigMap, as the operator's flags default to.
var CA = types.NamespacedName{Namespace: Namespace, Name: "lockstepd-ca"}

// Decode reads every object of a multi-document YAML (or JSON) stream, skipping empty documents.
func Decode(raw []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

// Apply applies every object of a YAML file (server-side apply).
func Apply(tb testing.TB, c client.Client, path string) {
	tb.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	objs, err := Decode(data)
	if err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
	for _, u := range objs {
		if err := c.Apply(context.Background(), client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("lockstep-test"), client.ForceOwnership); err != nil {
			tb.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
}

// ApplyKustomization applies the resources that a kustomization.yaml lists (dir's; plain
// resources, no patches or generators), so that a file added to it is applied too.
func ApplyKustomization(tb testing.TB, c client.Client, dir string) {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		tb.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
		Patches   []any    `json:"patches"`
	}
	if err := sigsyaml.Unmarshal(data, &k); err != nil {
		tb.Fatalf("%s: %v", dir, err)
	}
	if len(k.Patches) > 0 || len(k.Resources) == 0 {
		tb.Fatalf("%s: ApplyKustomization takes a kustomization of plain resources", dir)
	}
	for _, r := range k.Resources {
		Apply(tb, c, filepath.Join(dir, r))
	}
}

// InstallIdentities applies what the install gives the operator and lockstepd to act as
// themselves: their ServiceAccounts and generated RBAC, and lockstepd's admission policy
// (config/rbac, config/lockstepd). root is the repository's root.
func InstallIdentities(tb testing.TB, c client.Client, root string) {
	tb.Helper()
	if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		tb.Fatal(err)
	}
	for _, f := range []string{"rbac/service_account.yaml", "rbac/role.yaml", "rbac/role_binding.yaml",
		"lockstepd/rbac/service_account.yaml", "lockstepd/rbac/role.yaml", "lockstepd/rbac/role_binding.yaml", "lockstepd/admission-policy.yaml"} {
		Apply(tb, c, filepath.Join(root, "config", f))
	}
}

// StartSigner runs the operator's lockstepd certificate signer (controllers.LockstepdSigner) in
// the test process, as the operator's ServiceAccount (impersonated: its RBAC is what counts),
// until the test ends. It returns once the CA is published, with the CA's certificate (PEM).
func StartSigner(tb testing.TB, cfg *rest.Config, c client.Client) []byte {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	tb.Cleanup(func() { cancel(); <-done })
	op := rest.CopyConfig(cfg)
	op.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + Namespace + ":lockstep-operator"}
	mgr, err := ctrl.NewManager(op, ctrl.Options{Scheme: scheme.New(), Cache: controllers.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		tb.Fatal(err)
	}
	signer := &controllers.LockstepdSigner{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Config: controllers.SignerConfig{
		CA: CA, ServiceAccount: "system:serviceaccount:" + Namespace + ":lockstepd", MaxLifetime: 24 * time.Hour, CALifetime: 48 * time.Hour}}
	if err := signer.SetupWithManager(mgr); err != nil {
		tb.Fatal(err)
	}
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			tb.Errorf("the signer stopped: %v", err)
		}
	}()
	cm := &corev1.ConfigMap{}
	deadline := time.Now().Add(30 * time.Second)
	for c.Get(ctx, CA, cm) != nil || cm.Data["ca.crt"] == "" {
		if time.Now().After(deadline) {
			tb.Fatal("the signer did not publish the lockstepd CA within 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return []byte(cm.Data["ca.crt"])
}

// LockstepdPod makes the pod of the lockstepd of node (named lockstepd-<node>) and returns a
// token of lockstepd's ServiceAccount bound to it, as the kubelet mounts it, and one bound to
// nothing.
func LockstepdPod(tb testing.TB, cfg *rest.Config, c client.Client, node string) (bound, unbound string) {
	tb.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "lockstepd-" + node},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "lockstepd", Containers: []corev1.Container{{Name: "lockstepd", Image: "lockstepd"}}}}
	if err := c.Create(ctx, pod); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Delete(context.Background(), pod) })
	cs := kubernetes.NewForConfigOrDie(cfg)
	token := func(req *authenticationv1.TokenRequest) string {
		tr, err := cs.CoreV1().ServiceAccounts(Namespace).CreateToken(ctx, "lockstepd", req, metav1.CreateOptions{})
		if err != nil {
			tb.Fatalf("token request: %v", err)
		}
		return tr.Status.Token
	}
	ref := &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	return token(&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: ref}}), token(&authenticationv1.TokenRequest{})
}

// As is a client of the API server with only a bearer token.
func As(tb testing.TB, cfg *rest.Config, token string) client.Client {
	tb.Helper()
	ac := rest.AnonymousClientConfig(cfg)
	ac.BearerToken = token
	c, err := client.New(ac, client.Options{Scheme: scheme.New()})
	if err != nil {
		tb.Fatal(err)
	}
	return c
}
