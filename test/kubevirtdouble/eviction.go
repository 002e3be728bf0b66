package kubevirtdouble

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// EvictionInterceptor is a TEST DOUBLE of virt-api's virt-launcher-eviction-interceptor, the
// admission webhook on pods/eviction by which KubeVirt turns `kubectl drain` into an evacuation.
// As KubeVirt does, for the launcher pod of a VMI whose evictionStrategy is External (or a
// LiveMigrate one), it refuses the eviction with 429 Too Many Requests (kubectl drain retries
// every 5 s) and, the first time, sets the VMI's status.evacuationNodeName to the pod's node, for
// the VMI's controller (lockstep, for a member) to move it; the pod goes when its VMI does, and
// the drain with it. A dry-run eviction is refused without the mark. Every other eviction is
// allowed. It differs from virt-api in what does not concern members (whose strategy is External):
// it does not look at the cluster-wide default eviction strategy (a VMI without one is evicted),
// treats a LiveMigrate VMI as evacuable whether or not it can migrate, and skips virt-api's check
// of a migration's target pod. Its certificate lasts a day.
type EvictionInterceptor struct {
	Client client.Client
}

// EvictionInterceptorName is the webhook's name, as virt-api registers it (denials name it).
const EvictionInterceptorName = "virt-launcher-eviction-interceptor.kubevirt.io"

// evictionPath is where the double serves it.
const evictionPath = "/virt-launcher-eviction-interceptor"

// Handle answers one eviction.
func (e *EvictionInterceptor) Handle(ctx context.Context, req admission.Request) admission.Response {
	pod := &corev1.Pod{}
	if err := e.Client.Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: req.Name}, pod); err != nil {
		return admission.Allowed("not a pod the double knows")
	}
	owner := metav1.GetControllerOf(pod)
	if pod.Labels["kubevirt.io"] != launcherApp || owner == nil || owner.Kind != "VirtualMachineInstance" {
		return admission.Allowed("not a virt-launcher pod")
	}
	vmi := &virtv1.VirtualMachineInstance{}
	if err := e.Client.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: owner.Name}, vmi); err != nil || vmi.UID != owner.UID {
		return admission.Allowed("its VMI is gone")
	}
	if !evacuates(vmi.Spec.EvictionStrategy) {
		return admission.Allowed("the VMI has no eviction strategy that evacuates it")
	}
	msg := fmt.Sprintf("Eviction triggered evacuation of VMI \"%s/%s\"", vmi.Namespace, vmi.Name)
	if vmi.Status.EvacuationNodeName != "" {
		msg = fmt.Sprintf("Evacuation in progress: %s", msg)
	} else if !ptr.Deref(req.DryRun, false) {
		base := vmi.DeepCopy()
		vmi.Status.EvacuationNodeName = pod.Spec.NodeName
		if err := e.Client.Patch(ctx, vmi, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
	}
	return admission.Response{AdmissionResponse: admissionResponse(msg)}
}

func evacuates(s *virtv1.EvictionStrategy) bool {
	if s == nil {
		return false
	}
	switch *s {
	case virtv1.EvictionStrategyExternal, virtv1.EvictionStrategyLiveMigrate, virtv1.EvictionStrategyLiveMigrateIfPossible:
		return true
	}
	return false
}

// Serve serves the interceptor on 127.0.0.1:port with a certificate of its own and registers it
// with the API server (a ValidatingWebhookConfiguration calling it there, as virt-operator
// registers virt-api's, failurePolicy Ignore), until ctx ends. KubeVirt relies on a
// PodDisruptionBudget of its own while virt-api is down; the double makes none, so with it stopped
// a launcher pod is evicted outright.
func (e *EvictionInterceptor) Serve(ctx context.Context, port int) error {
	dir, err := os.MkdirTemp("", "kubevirt-double-webhook-")
	if err != nil {
		return err
	}
	caPEM, err := selfSignedCertificate(dir)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle(evictionPath, &admission.Webhook{Handler: e})
	srv := &http.Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", srv.Addr)
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
		_ = os.RemoveAll(dir)
	}()
	go func() { _ = srv.ServeTLS(ln, filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")) }()
	return e.register(ctx, fmt.Sprintf("https://%s%s", srv.Addr, evictionPath), caPEM)
}

func (e *EvictionInterceptor) register(ctx context.Context, url string, caPEM []byte) error {
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "virt-api-validator"}}
	_, err := controllerutil.CreateOrUpdate(ctx, e.Client, cfg, func() error {
		ignore, none := admissionregistrationv1.Ignore, admissionregistrationv1.SideEffectClassNoneOnDryRun
		cfg.Webhooks = []admissionregistrationv1.ValidatingWebhook{{
			Name:                    EvictionInterceptorName,
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods/eviction"}}}},
			FailurePolicy:           &ignore,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To(int32(10)),
		}}
		return nil
	})
	return err
}

// admissionResponse refuses with 429, as virt-api does, so that kubectl drain retries.
func admissionResponse(msg string) admissionv1.AdmissionResponse {
	return admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusTooManyRequests, Reason: metav1.StatusReasonTooManyRequests, Message: msg,
	}}
}

// selfSignedCertificate writes tls.crt and tls.key for 127.0.0.1 into dir and returns the
// certificate (its own CA) in PEM.
func selfSignedCertificate(dir string) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "virt-api (test double)"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), certPEM, 0o600); err != nil {
		return nil, err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	return certPEM, os.WriteFile(filepath.Join(dir, "tls.key"), keyPEM, 0o600)
}
