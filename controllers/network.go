package controllers

import (
	"context"
	"fmt"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
