package admission

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// +kubebuilder:webhook:path=/validate-kubevirt-io-v1-virtualmachineinstancemigration,mutating=false,failurePolicy=ignore,sideEffects=None,groups=kubevirt.io,resources=virtualmachineinstancemigrations,verbs=create,versions=v1,name=vmigration.ft.lockstep.dev,admissionReviewVersions=v1,timeoutSeconds=5

// MigrationValidator refuses a live migration of an FT member: it would start a third copy of
// the VM on a third node, outside the pair and its replication (docs/kubevirt.md). This covers
// `virtctl migrate`, the VM's migrate subresource, evacuation and node drains, which all create a
// VirtualMachineInstanceMigration.
type MigrationValidator struct {
	// Reader reads member VMIs (the operator's cache holds lockstep's own).
	Reader client.Reader
}

var _ admission.Validator[*virtv1.VirtualMachineInstanceMigration] = &MigrationValidator{}

// ValidateCreate refuses the migration of a member.
func (v *MigrationValidator) ValidateCreate(ctx context.Context, m *virtv1.VirtualMachineInstanceMigration) (admission.Warnings, error) {
	var vmi virtv1.VirtualMachineInstance
	err := v.Reader.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.VMIName}, &vmi)
	if apierrors.IsNotFound(err) {
		return nil, nil // not one of lockstep's VMIs
	}
	if err != nil {
		return nil, fmt.Errorf("reading VMI %s/%s: %w", m.Namespace, m.Spec.VMIName, err)
	}
	pair, ok := vmi.Labels[ftv1.LabelPair]
	if !ok {
		return nil, nil
	}
	return nil, apierrors.NewForbidden(virtv1.SchemeGroupVersion.WithResource("virtualmachineinstancemigrations").GroupResource(), m.Name,
		fmt.Errorf("VMI %s is the %s of FaultTolerantVM %s: live migration would start a third copy of the VM outside the pair; "+
			"lockstep moves members itself (drain the node and lockstep replaces the member elsewhere)",
			vmi.Name, vmi.Labels[ftv1.LabelRole], pair))
}

// ValidateUpdate admits: a migration's spec cannot change after creation.
func (v *MigrationValidator) ValidateUpdate(context.Context, *virtv1.VirtualMachineInstanceMigration, *virtv1.VirtualMachineInstanceMigration) (admission.Warnings, error) {
	return nil, nil
}

// ValidateDelete admits.
func (v *MigrationValidator) ValidateDelete(context.Context, *virtv1.VirtualMachineInstanceMigration) (admission.Warnings, error) {
	return nil, nil
}
