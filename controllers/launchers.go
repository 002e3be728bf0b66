package controllers

import (
	"context"
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch

// phaseLauncherRoles keeps each member's virt-launcher pod labelled with the member's role.
// KubeVirt copies a VMI's labels to its launcher pod only when it creates the pod, so after a
// promotion the pod would still say secondary: a Service that carries the VM's own traffic on the
// pod network selects ft.lockstep.dev/role=primary, and must follow the VM to the member that
// runs it (and drop a fenced one at once).
func (r *FaultTolerantVMReconciler) phaseLauncherRoles(ctx context.Context, s *scope) error {
	if len(s.members) == 0 {
		return nil
	}
	byUID := map[string]*memberView{}
	for _, mv := range s.members {
		byUID[string(mv.vmi.UID)] = mv
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(s.ftvm.Namespace), client.MatchingLabels{ftv1.LabelPair: s.ftvm.Name}); err != nil {
		return err
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		mv := byUID[pod.Labels[virtv1.CreatedByLabel]]
		if mv == nil || pod.DeletionTimestamp != nil {
			continue
		}
		role := mv.vmi.Labels[ftv1.LabelRole]
		if role == "" || pod.Labels[ftv1.LabelRole] == role {
			continue
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{ftv1.LabelRole: role}}})
		if err := r.Patch(ctx, pod, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return client.IgnoreNotFound(err)
		}
	}
	return nil
}
