package kubevirtcontrol

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/lockstep-dev/lockstep/test/pki"
)

// StartVirtAPI runs virt-api (Start) with the API server access of kubeconfig, its certificates
// issued by ca (as virt-operator issues them from its own CA), waits until it serves, and installs
// its webhook configurations pointing at it. The API server must have the request-header flags of
// a kubeadm cluster (--requestheader-client-ca-file and the rest): virt-api does not start without
// the request-header CA that the API server publishes in kube-system/extension-apiserver-authentication.
func StartVirtAPI(ctx context.Context, c client.Client, s Strategy, bin, kubeconfig, dir string, ca *pki.CA) (*Component, error) {
	// The CA virt-api trusts for virt-handler's certificates, as virt-operator publishes it.
	bundle := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "kubevirt-ca"}}
	if _, err := controllerutil.CreateOrUpdate(ctx, c, bundle, func() error {
		bundle.Data = map[string]string{"ca-bundle": string(ca.PEM())}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("the kubevirt-ca ConfigMap: %w", err)
	}
	api, err := Start(s, bin, "virt-api", kubeconfig, dir, func(dir string) ([]string, error) {
		serving, servingKey := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
		if err := ca.WriteKeyPair(serving, servingKey, "virt-api", "virt-api."+Namespace+".svc"); err != nil {
			return nil, err
		}
		handler, handlerKey := filepath.Join(dir, "handler.crt"), filepath.Join(dir, "handler.key")
		if err := ca.WriteKeyPair(handler, handlerKey, "kubevirt.io:system:client:virt-handler"); err != nil {
			return nil, err
		}
		return []string{"--tls-cert-file", serving, "--tls-key-file", servingKey, "--handler-cert-file", handler, "--handler-key-file", handlerKey}, nil
	})
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", api.Port)
	if err := waitServing(addr, ca, api.Exited, 2*time.Minute); err != nil {
		api.Stop()
		return nil, fmt.Errorf("virt-api: %w\n%s", err, Tail(api.Log, 30))
	}
	if err := s.InstallWebhooks(ctx, c, "https://"+addr, ca); err != nil {
		api.Stop()
		return nil, err
	}
	return api, nil
}

// waitServing waits until addr completes a TLS handshake with a certificate ca issued: virt-api
// listens once its informers have synced and its certificate is loaded.
func waitServing(addr string, ca *pki.CA, exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool, ServerName: "virt-api." + Namespace + ".svc", MinVersion: tls.VersionTLS12})
		if err == nil {
			return conn.Close()
		}
		select {
		case <-exited:
			return fmt.Errorf("it exited before it served on %s", addr)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not serving on %s after %s: %w", addr, timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// MarkDeployed writes the KubeVirt CR's status as virt-operator does once KubeVirt runs: deployed
// (virt-controller takes useEmulation only then), with the default architecture, this machine's
// (virt-api's VMI mutator gives it to VMIs that name none, and its validator refuses a VMI
// without one).
func MarkDeployed(ctx context.Context, c client.Client, name string) error {
	kv := &virtv1.KubeVirt{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: name}, kv); err != nil {
		return fmt.Errorf("the KubeVirt CR %s/%s: %w", Namespace, name, err)
	}
	if kv.Status.Phase == virtv1.KubeVirtPhaseDeployed && kv.Status.DefaultArchitecture == goruntime.GOARCH {
		return nil
	}
	kv.Status.Phase, kv.Status.DefaultArchitecture = virtv1.KubeVirtPhaseDeployed, goruntime.GOARCH
	return c.Status().Update(ctx, kv)
}

// Tail is the last n lines of the file at path, for messages.
func Tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
