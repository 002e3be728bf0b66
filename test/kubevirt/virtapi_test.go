package kubevirt_test

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/lockstep-dev/lockstep/test/pki"
)

// virt-api, KubeVirt's admission and subresource server, runs as a process beside the API server
// as its Deployment in the install strategy runs it. Three things differ from a cluster, each
// because no Service reaches a process on loopback: the webhooks name virt-api by URL rather than
// by Service (the API server refuses loopback Endpoints), virt-operator's caBundle injection is
// done here with the test's CA, and the APIServices of subresources.kubevirt.io (console, VNC,
// migrate) are not registered. virt-operator's own validator (on KubeVirt CRs) is not installed:
// virt-operator does not run.

// virtAPIWebhooks are the strategy's webhook configurations that virt-api serves.
var virtAPIWebhooks = []string{"virt-api-validator", "virt-api-mutator", "virt-launcher-pod-mutator"}

// frontProxy gives the API server the request-header flags a kubeadm cluster has: virt-api does
// not start without the request-header CA that the API server then publishes in
// kube-system/extension-apiserver-authentication.
func frontProxy(env *envtest.Environment, dir string, ca *pki.CA) error {
	caFile := filepath.Join(dir, "front-proxy-ca.crt")
	if err := os.WriteFile(caFile, ca.PEM(), 0o600); err != nil {
		return err
	}
	cert, key := filepath.Join(dir, "front-proxy-client.crt"), filepath.Join(dir, "front-proxy-client.key")
	if err := ca.WriteKeyPair(cert, key, "front-proxy-client"); err != nil {
		return err
	}
	args := env.ControlPlane.GetAPIServer().Configure()
	args.Set("requestheader-client-ca-file", caFile)
	args.Set("requestheader-allowed-names", "front-proxy-client")
	args.Set("requestheader-username-headers", "X-Remote-User")
	args.Set("requestheader-group-headers", "X-Remote-Group")
	args.Set("requestheader-extra-headers-prefix", "X-Remote-Extra-")
	args.Set("proxy-client-cert-file", cert)
	args.Set("proxy-client-key-file", key)
	return nil
}

// startVirtAPI runs virt-api as user (startComponent), its certificates issued by ca (as
// virt-operator issues them from its own CA), waits until it serves, and installs its webhook
// configurations pointing at it. It returns what stops it; its output goes to virtAPILog.
func startVirtAPI(ctx context.Context, user *envtest.AuthenticatedUser, strategy []*unstructured.Unstructured, bin string, ca *pki.CA) (func(), error) {
	// The CA virt-api trusts for virt-handler's certificates, as virt-operator publishes it.
	if err := k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: kubevirtNamespace, Name: "kubevirt-ca"},
		Data: map[string]string{"ca-bundle": string(ca.PEM())}}); err != nil {
		return nil, err
	}
	c, err := startComponent(user, strategy, bin, "virt-api", func(dir string) ([]string, error) {
		serving, servingKey := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
		if err := ca.WriteKeyPair(serving, servingKey, "virt-api", "virt-api."+kubevirtNamespace+".svc"); err != nil {
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
	virtAPILog = c.log
	addr := fmt.Sprintf("127.0.0.1:%d", c.port)
	if err := waitServing(addr, ca, 2*time.Minute); err != nil {
		c.stop()
		return nil, fmt.Errorf("virt-api: %w\n%s", err, tail(virtAPILog, 30))
	}
	if err := installWebhooks(ctx, strategy, "https://"+addr, ca); err != nil {
		c.stop()
		return nil, err
	}
	return c.stop, nil
}

// waitServing waits until addr completes a TLS handshake with a certificate ca issued: virt-api
// listens once its informers have synced and its certificate is loaded.
func waitServing(addr string, ca *pki.CA, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool, ServerName: "virt-api." + kubevirtNamespace + ".svc", MinVersion: tls.VersionTLS12})
		if err == nil {
			return conn.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not serving on %s after %s: %w", addr, timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// installWebhooks applies the strategy's configurations of virt-api's webhooks, each webhook
// pointed at url with its path and trusting ca.
func installWebhooks(ctx context.Context, strategy []*unstructured.Unstructured, url string, ca *pki.CA) error {
	for _, u := range strategy {
		if (u.GetKind() != "ValidatingWebhookConfiguration" && u.GetKind() != "MutatingWebhookConfiguration") || !slices.Contains(virtAPIWebhooks, u.GetName()) {
			continue
		}
		u = u.DeepCopy()
		hooks, _, _ := unstructured.NestedSlice(u.Object, "webhooks")
		for i, h := range hooks {
			hook := h.(map[string]any)
			path, _, _ := unstructured.NestedString(hook, "clientConfig", "service", "path")
			hook["clientConfig"] = map[string]any{"url": url + path, "caBundle": base64.StdEncoding.EncodeToString(ca.PEM())}
			hooks[i] = hook
		}
		if err := unstructured.SetNestedSlice(u.Object, hooks, "webhooks"); err != nil {
			return err
		}
		if err := k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("virt-operator"), client.ForceOwnership); err != nil {
			return fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	return nil
}

// setArg sets the value that follows flag in args, if it is there.
func setArg(args []string, flag, value string) {
	for i := range args {
		if args[i] == flag && i+1 < len(args) {
			args[i+1] = value
		}
	}
}

// isWebhookDenial says whether err is a refusal by the webhook named name.
func isWebhookDenial(err error, name string) bool {
	return err != nil && strings.Contains(err.Error(), fmt.Sprintf("admission webhook %q denied", name))
}
