package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/member"
)

// ensureLoggingNetwork makes sure the logging NetworkAttachmentDefinition exists, creating it when
// the FaultTolerantVM gives its config. It returns why the network is missing ("" when it is
// there). An existing definition is never changed: other pairs may use it.
func ensureLoggingNetwork(ctx context.Context, c client.Client, ftvm *ftv1.FaultTolerantVM) (string, error) {
	ns, name := member.LoggingNetworkKey(ftvm)
	var nad nadv1.NetworkAttachmentDefinition
	err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &nad)
	if err == nil {
		return "", nil
	}
	if !apierrors.IsNotFound(err) {
		if apierrors.IsForbidden(err) || meta.IsNoMatchError(err) {
			return fmt.Sprintf("cannot read NetworkAttachmentDefinition %s/%s: %v (is Multus installed?)", ns, name, err), nil
		}
		return "", err
	}
	if ftvm.Spec.LoggingNetwork.Config == "" {
		return fmt.Sprintf("NetworkAttachmentDefinition %s/%s does not exist: create it, or give spec.loggingNetwork.config", ns, name), nil
	}
	nad = nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: ns,
			Labels: map[string]string{ftv1.LabelManagedBy: ftv1.ManagedByValue},
			Annotations: map[string]string{
				"ft.lockstep.dev/created-for": ftvm.Namespace + "/" + ftvm.Name,
			},
		},
		Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: ftvm.Spec.LoggingNetwork.Config},
	}
	if err := c.Create(ctx, &nad); err != nil && !apierrors.IsAlreadyExists(err) {
		if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) {
			return fmt.Sprintf("cannot create NetworkAttachmentDefinition %s/%s: %v", ns, name, err), nil
		}
		return "", err
	}
	return "", nil
}

// releaseLoggingNetwork deletes the logging network of a FaultTolerantVM being deleted when the
// operator created it (from spec.loggingNetwork.config) and no other FaultTolerantVM, in any
// namespace, uses it. A definition the user made is never touched.
func (r *FaultTolerantVMReconciler) releaseLoggingNetwork(ctx context.Context, ftvm *ftv1.FaultTolerantVM) error {
	ns, name := member.LoggingNetworkKey(ftvm)
	var nad nadv1.NetworkAttachmentDefinition
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &nad); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || meta.IsNoMatchError(err) {
			return nil
		}
		return err
	}
	if nad.Labels[ftv1.LabelManagedBy] != ftv1.ManagedByValue || nad.DeletionTimestamp != nil {
		return nil
	}
	var all ftv1.FaultTolerantVMList
	if err := r.APIReader.List(ctx, &all); err != nil {
		return err
	}
	for i := range all.Items {
		other := &all.Items[i]
		if other.UID == ftvm.UID || other.DeletionTimestamp != nil {
			continue
		}
		if ons, oname := member.LoggingNetworkKey(other); ons == ns && oname == name {
			return nil // still in use
		}
	}
	// lockstepd's pods attach the logging network (its DaemonSet names it): deleted under them,
	// the next lockstepd to start on a node would find no network, and protect nothing there.
	if user, err := r.podAttaching(ctx, ns, name); err != nil || user != "" {
		if user != "" {
			log.FromContext(ctx).Info("keeping the logging network the operator created: a pod attaches it", "network", ns+"/"+name, "pod", user)
		}
		return err
	}
	if err := r.Delete(ctx, &nad, client.Preconditions{UID: &nad.UID}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting the logging network %s/%s: %w", ns, name, err)
	}
	log.FromContext(ctx).Info("deleted the logging network the operator created", "network", ns+"/"+name)
	return nil
}

// podAttaching names a pod, in lockstepd's namespace or the network's, that attaches the
// NetworkAttachmentDefinition ns/name through Multus ("" when none does).
func (r *FaultTolerantVMReconciler) podAttaching(ctx context.Context, ns, name string) (string, error) {
	for _, where := range slices.Compact([]string{r.Config.LockstepdNamespace, ns}) {
		if where == "" {
			continue
		}
		var pods corev1.PodList
		if err := r.APIReader.List(ctx, &pods, client.InNamespace(where)); err != nil {
			return "", err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.DeletionTimestamp == nil && attaches(p.Namespace, p.Annotations[multusNetworks], ns, name) {
				return p.Namespace + "/" + p.Name, nil
			}
		}
	}
	return "", nil
}

// multusNetworks is the pod annotation by which Multus attaches more networks.
const multusNetworks = "k8s.v1.cni.cncf.io/networks"

// attaches says whether a pod in podNS whose Multus annotation is networks attaches ns/name. The
// annotation is a list of "[namespace/]name[@interface]", or JSON objects with name and namespace.
func attaches(podNS, networks, ns, name string) bool {
	networks = strings.TrimSpace(networks)
	if networks == "" {
		return false
	}
	if strings.HasPrefix(networks, "[") {
		var list []struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		}
		if json.Unmarshal([]byte(networks), &list) != nil {
			return false
		}
		for _, n := range list {
			if n.Name == name && (n.Namespace == ns || n.Namespace == "" && podNS == ns) {
				return true
			}
		}
		return false
	}
	for _, item := range strings.Split(networks, ",") {
		item, _, _ = strings.Cut(strings.TrimSpace(item), "@")
		nns, nname, ok := strings.Cut(item, "/")
		if !ok {
			nns, nname = podNS, item
		}
		if nns == ns && nname == name {
			return true
		}
	}
	return false
}
