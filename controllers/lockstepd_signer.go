package controllers

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/lockstep-dev/lockstep/internal/nodecert"
)

// SignerConfig is the lockstepd certificate signer's configuration.
type SignerConfig struct {
	// CA is the Secret that holds the signer's CA (made by the signer when missing) and the
	// ConfigMap, of the same name, in which the signer publishes the CA's certificate (ca.crt)
	// for every lockstepd.
	CA types.NamespacedName
	// ServiceAccount is lockstepd's ServiceAccount, "system:serviceaccount:<namespace>:<name>":
	// the only requester the signer serves.
	ServiceAccount string
	// MaxLifetime bounds the certificates it issues; CALifetime is the lifetime of a CA it makes.
	MaxLifetime, CALifetime time.Duration
}

// Reasons of the conditions that the signer sets on a CertificateSigningRequest.
const (
	ReasonNodeIdentity    = "LockstepdNodeIdentity"
	ReasonNotItsOwnNode   = "NotItsOwnNode"
	ReasonSignerNoCA      = "SignerHasNoCA"
	caCertKey, caKeyKey   = "tls.crt", "tls.key"
	caPublishedKey        = "ca.crt"
	minCertificateSeconds = 600
)

// LockstepdSigner is the signer lockstep.dev/lockstepd: it gives each lockstepd a certificate
// that names its node, and only the node that lockstepd's pod-bound ServiceAccount token names
// (nodecert.Review), as the kubelet's client certificates are restricted to their node. Peers on
// the logging network then accept each other by node.
type LockstepdSigner struct {
	Client    client.Client
	APIReader client.Reader
	Config    SignerConfig

	mu sync.Mutex
	ca *nodecert.CA
}

// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=get;list;watch
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests/approval,verbs=update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests/status,verbs=update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,resourceNames=lockstep.dev/lockstepd,verbs=approve;sign
// +kubebuilder:rbac:groups="",namespace=lockstep-system,resources=secrets,verbs=get;create
// +kubebuilder:rbac:groups="",namespace=lockstep-system,resources=configmaps,verbs=get;create;update

// SetupWithManager registers the signer; its CA is made and published as soon as it leads.
func (s *LockstepdSigner) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		if _, err := s.authority(ctx); err != nil {
			log.FromContext(ctx).Error(err, "making or publishing the lockstepd CA; retried at the next request")
		}
		return nil
	})); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&certificatesv1.CertificateSigningRequest{}).
		Named("lockstepd-signer").
		Complete(s)
}

// Reconcile approves or denies a request of the signer and signs the approved ones.
func (s *LockstepdSigner) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	csr := &certificatesv1.CertificateSigningRequest{}
	if err := s.Client.Get(ctx, req.NamespacedName, csr); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if csr.Spec.SignerName != nodecert.SignerName || len(csr.Status.Certificate) > 0 ||
		hasCondition(csr, certificatesv1.CertificateDenied) || hasCondition(csr, certificatesv1.CertificateFailed) {
		return ctrl.Result{}, nil
	}
	lg := log.FromContext(ctx).WithValues("requester", csr.Spec.Username)
	if !hasCondition(csr, certificatesv1.CertificateApproved) {
		node, err := nodecert.Review(requestOf(csr), s.Config.ServiceAccount)
		cond := certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: ReasonNodeIdentity,
			Message: "lockstepd of node " + node + " asks for its own node's certificate", LastUpdateTime: metav1.Now(),
		}
		if err != nil {
			cond.Type, cond.Reason, cond.Message = certificatesv1.CertificateDenied, ReasonNotItsOwnNode, err.Error()
		}
		csr.Status.Conditions = append(csr.Status.Conditions, cond)
		if err := s.Client.SubResource("approval").Update(ctx, csr); err != nil {
			return ctrl.Result{}, fmt.Errorf("setting %s on %s: %w", cond.Type, csr.Name, err)
		}
		lg.Info(string(cond.Type), "message", cond.Message)
		if cond.Type == certificatesv1.CertificateDenied {
			return ctrl.Result{}, nil
		}
	}
	ca, err := s.authority(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	lifetime := s.Config.MaxLifetime
	if e := csr.Spec.ExpirationSeconds; e != nil && time.Duration(max(*e, minCertificateSeconds))*time.Second < lifetime {
		lifetime = time.Duration(max(*e, minCertificateSeconds)) * time.Second
	}
	cert, err := ca.Sign(csr.Spec.Request, time.Now(), lifetime)
	if err != nil {
		// Reviewed, so only a broken CA gets here: say so on the request.
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateFailed, Status: corev1.ConditionTrue, Reason: ReasonSignerNoCA,
			Message: err.Error(), LastUpdateTime: metav1.Now(),
		})
	}
	csr.Status.Certificate = cert
	if err := s.Client.Status().Update(ctx, csr); err != nil {
		return ctrl.Result{}, fmt.Errorf("issuing %s: %w", csr.Name, err)
	}
	lg.Info("issued", "certificatesigningrequest", csr.Name, "lifetime", lifetime)
	return ctrl.Result{}, nil
}

func hasCondition(csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func requestOf(csr *certificatesv1.CertificateSigningRequest) nodecert.Request {
	r := nodecert.Request{Username: csr.Spec.Username, CSR: csr.Spec.Request, Extra: map[string][]string{}}
	for k, v := range csr.Spec.Extra {
		r.Extra[k] = v
	}
	for _, u := range csr.Spec.Usages {
		r.Usages = append(r.Usages, string(u))
	}
	return r
}

// authority is the signer's CA: read from its Secret, made there first if missing, and its
// certificate published in the ConfigMap that every lockstepd mounts.
func (s *LockstepdSigner) authority(ctx context.Context) (*nodecert.CA, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ca != nil && time.Now().Before(s.ca.Cert.NotAfter) {
		return s.ca, nil
	}
	sec := &corev1.Secret{}
	err := s.APIReader.Get(ctx, s.Config.CA, sec)
	if apierrors.IsNotFound(err) {
		var certPEM, keyPEM []byte
		if certPEM, keyPEM, err = nodecert.NewCA(time.Now(), s.Config.CALifetime); err != nil {
			return nil, err
		}
		sec = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: s.Config.CA.Namespace, Name: s.Config.CA.Name},
			Type:       corev1.SecretTypeTLS, Data: map[string][]byte{caCertKey: certPEM, caKeyKey: keyPEM},
		}
		if err = s.Client.Create(ctx, sec); apierrors.IsAlreadyExists(err) {
			err = s.APIReader.Get(ctx, s.Config.CA, sec) // another replica made it first
		}
		if err == nil {
			log.FromContext(ctx).Info("made the lockstepd CA", "secret", s.Config.CA)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("the lockstepd CA's Secret %s: %w", s.Config.CA, err)
	}
	ca, err := nodecert.ParseCA(sec.Data[caCertKey], sec.Data[caKeyKey])
	if err != nil {
		return nil, fmt.Errorf("the lockstepd CA's Secret %s: %w", s.Config.CA, err)
	}
	if err := s.publish(ctx, sec.Data[caCertKey]); err != nil {
		return nil, err
	}
	s.ca = ca
	return ca, nil
}

// publish writes the CA's certificate into the ConfigMap that lockstepd mounts.
func (s *LockstepdSigner) publish(ctx context.Context, certPEM []byte) error {
	cm := &corev1.ConfigMap{}
	err := s.APIReader.Get(ctx, s.Config.CA, cm)
	switch {
	case apierrors.IsNotFound(err):
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: s.Config.CA.Namespace, Name: s.Config.CA.Name},
			Data: map[string]string{caPublishedKey: string(certPEM)}}
		err = s.Client.Create(ctx, cm)
	case err == nil && !bytes.Equal([]byte(cm.Data[caPublishedKey]), certPEM):
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[caPublishedKey] = string(certPEM)
		err = s.Client.Update(ctx, cm)
	}
	if err != nil {
		return fmt.Errorf("publishing the lockstepd CA in ConfigMap %s: %w", s.Config.CA, err)
	}
	return nil
}
