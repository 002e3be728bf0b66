package admission

import (
	"context"
	"fmt"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/member"
	"github.com/lockstep-dev/lockstep/internal/placement"
	"github.com/lockstep-dev/lockstep/internal/validation"
)

// +kubebuilder:webhook:path=/mutate-ft-lockstep-dev-v1alpha1-faulttolerantvm,mutating=true,failurePolicy=fail,sideEffects=None,groups=ft.lockstep.dev,resources=faulttolerantvms,verbs=create;update,versions=v1alpha1,name=mfaulttolerantvm.ft.lockstep.dev,admissionReviewVersions=v1,timeoutSeconds=10,reinvocationPolicy=Never
// +kubebuilder:webhook:path=/validate-ft-lockstep-dev-v1alpha1-faulttolerantvm,mutating=false,failurePolicy=fail,sideEffects=None,groups=ft.lockstep.dev,resources=faulttolerantvms,verbs=create;update,versions=v1alpha1,name=vfaulttolerantvm.ft.lockstep.dev,admissionReviewVersions=v1,timeoutSeconds=10

// The webhook reads nodes (their FT limits and capacity), logging networks, and the VM's
// namespace (its Pod Security level).
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// +kubebuilder:rbac:groups=k8s.cni.cncf.io,resources=network-attachment-definitions,verbs=get;list;watch

// FaultTolerantVMDefaulter sets the spec's defaults (ftv1.Default).
type FaultTolerantVMDefaulter struct{}

var _ admission.Defaulter[*ftv1.FaultTolerantVM] = FaultTolerantVMDefaulter{}

// Default sets the defaults.
func (FaultTolerantVMDefaulter) Default(_ context.Context, ftvm *ftv1.FaultTolerantVM) error {
	ftv1.Default(ftvm)
	return nil
}

// FaultTolerantVMValidator refuses what FT cannot protect.
type FaultTolerantVMValidator struct {
	// Reader reads nodes and logging networks (the operator's cache).
	Reader client.Reader
	// Claims reads the claims the template names (the API server: the operator caches only its
	// own). Nil skips the check. It reads the VM's namespace too.
	Claims client.Reader
	// Limits are the cluster's FT limits, which nodes' annotations override.
	Limits placement.Limits
	// DefaultLogBandwidthMbps is reserved for a VM without spec.expectedLoad.
	DefaultLogBandwidthMbps int
	// COLO: members are COLO members (--colo): every disk that holds state must be on a claim
	// (validation.ValidateCOLO), and the secondary reserves the guest's memory twice.
	COLO bool
}

var _ admission.Validator[*ftv1.FaultTolerantVM] = &FaultTolerantVMValidator{}

// ValidateCreate runs every rule.
func (v *FaultTolerantVMValidator) ValidateCreate(ctx context.Context, ftvm *ftv1.FaultTolerantVM) (admission.Warnings, error) {
	errs := v.validate(ftvm)
	netErrs, warnings, err := v.loggingNetwork(ctx, ftvm)
	if err != nil {
		return nil, err
	}
	errs = append(errs, netErrs...)
	roomErrs, roomWarnings, err := v.room(ctx, ftvm)
	if err != nil {
		return nil, err
	}
	claimErrs, err := v.claims(ctx, ftvm)
	if err != nil {
		return nil, err
	}
	errs = append(errs, claimErrs...)
	adoptErrs, err := v.adoptedOnce(ctx, ftvm)
	if err != nil {
		return nil, err
	}
	errs = append(errs, adoptErrs...)
	podSecurityErrs, err := v.podSecurity(ctx, ftvm)
	if err != nil {
		return nil, err
	}
	errs = append(errs, podSecurityErrs...)
	warnings = append(warnings, validation.ExpectedLoadWarnings(ftvm, v.COLO)...)
	return append(warnings, roomWarnings...), invalid(ftvm, append(errs, roomErrs...))
}

// adoptedOnce refuses to adopt a VirtualMachine that another FaultTolerantVM adopts: both would
// start a pair on its disks once it is gone.
func (v *FaultTolerantVMValidator) adoptedOnce(ctx context.Context, ftvm *ftv1.FaultTolerantVM) (field.ErrorList, error) {
	if ftvm.Spec.AdoptFrom == nil {
		return nil, nil
	}
	var list ftv1.FaultTolerantVMList
	if err := v.Reader.List(ctx, &list, client.InNamespace(ftvm.Namespace)); err != nil {
		return nil, fmt.Errorf("listing FaultTolerantVMs: %w", err)
	}
	for _, other := range list.Items {
		if other.Name != ftvm.Name && other.Spec.AdoptFrom != nil && other.Spec.AdoptFrom.VirtualMachineName == ftvm.Spec.AdoptFrom.VirtualMachineName {
			return field.ErrorList{field.Forbidden(field.NewPath("spec", "adoptFrom", "virtualMachineName"),
				fmt.Sprintf("FaultTolerantVM %s adopts VirtualMachine %s already", other.Name, other.Spec.AdoptFrom.VirtualMachineName))}, nil
		}
	}
	return nil, nil
}

// podSecurity refuses a VM whose namespace enforces a Pod Security level under which its members'
// launcher pods could not be created: each mounts its member directory from the node (a hostPath,
// config/kubevirt), which the baseline and restricted levels refuse. Admitted, the VM would wait
// for members that never start.
func (v *FaultTolerantVMValidator) podSecurity(ctx context.Context, ftvm *ftv1.FaultTolerantVM) (field.ErrorList, error) {
	if v.Claims == nil {
		return nil, nil
	}
	var ns corev1.Namespace
	err := v.Claims.Get(ctx, types.NamespacedName{Name: ftvm.Namespace}, &ns)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil // the API server refuses an object in a namespace that does not exist
	case err != nil:
		return nil, fmt.Errorf("reading namespace %s: %w", ftvm.Namespace, err)
	}
	if why := validation.PodSecurityProblem(ns.Labels); why != "" {
		return field.ErrorList{field.Forbidden(field.NewPath("metadata", "namespace"), why)}, nil
	}
	return nil, nil
}

// claims refuses claims that exist and cannot back a protected VM's disk
// (validation.ClaimProblem). One that does not exist yet is the operator's to check when it does
// (GitOps applies a claim and its VM together).
func (v *FaultTolerantVMValidator) claims(ctx context.Context, ftvm *ftv1.FaultTolerantVM) (field.ErrorList, error) {
	if v.Claims == nil {
		return nil, nil
	}
	var errs field.ErrorList
	path := field.NewPath("spec", "template", "spec", "volumes")
	for i := range ftvm.Spec.Template.Spec.Volumes {
		name := member.ClaimOf(&ftvm.Spec.Template.Spec.Volumes[i])
		if name == "" {
			continue
		}
		var pvc corev1.PersistentVolumeClaim
		err := v.Claims.Get(ctx, types.NamespacedName{Namespace: ftvm.Namespace, Name: name}, &pvc)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("reading claim %s: %w", name, err)
		}
		if why := validation.ClaimProblem(&pvc, v.COLO); why != "" {
			errs = append(errs, field.Forbidden(path.Index(i), "claim "+name+" "+why))
		}
	}
	return errs, nil
}

// ValidateUpdate refuses only what the update makes wrong: a rule that the stored object already
// broke (it was admitted before the rule, or before the webhook) does not block a change that
// leaves it as it was, so that a VM can always be halted, fixed or deleted. The operator's own
// metadata writes (finalizers) and every write to an object being deleted pass.
func (v *FaultTolerantVMValidator) ValidateUpdate(ctx context.Context, old, ftvm *ftv1.FaultTolerantVM) (admission.Warnings, error) {
	if !ftvm.DeletionTimestamp.IsZero() {
		return nil, nil
	}
	errs := newErrors(v.validate(old), v.validate(ftvm))
	errs = append(errs, validation.ValidateUpdate(old, ftvm)...)
	var warnings admission.Warnings
	if old.Spec.LoggingNetwork != ftvm.Spec.LoggingNetwork {
		netErrs, w, err := v.loggingNetwork(ctx, ftvm)
		if err != nil {
			return nil, err
		}
		errs, warnings = append(errs, netErrs...), append(warnings, w...)
	}
	if !equality.Semantic.DeepEqual(old.Spec.Template.Spec.Volumes, ftvm.Spec.Template.Spec.Volumes) {
		before, err := v.claims(ctx, old)
		if err != nil {
			return nil, err
		}
		after, err := v.claims(ctx, ftvm)
		if err != nil {
			return nil, err
		}
		errs = append(errs, newErrors(before, after)...)
	}
	if !equality.Semantic.DeepEqual(old.Spec.ExpectedLoad, ftvm.Spec.ExpectedLoad) {
		warnings = append(warnings, validation.ExpectedLoadWarnings(ftvm, v.COLO)...)
	}
	if resized(old, ftvm, v.COLO) {
		roomErrs, w, err := v.room(ctx, ftvm)
		if err != nil {
			return nil, err
		}
		errs, warnings = append(errs, roomErrs...), append(warnings, w...)
	}
	return warnings, invalid(ftvm, errs)
}

// validate is every rule that reads nothing but the object: COLO's too, with COLO members.
func (v *FaultTolerantVMValidator) validate(ftvm *ftv1.FaultTolerantVM) field.ErrorList {
	errs := validation.Validate(ftvm)
	if v.COLO {
		errs = append(errs, validation.ValidateCOLO(ftvm)...)
	}
	return errs
}

// ValidateDelete never refuses: deleting a FaultTolerantVM removes its members.
func (v *FaultTolerantVMValidator) ValidateDelete(context.Context, *ftv1.FaultTolerantVM) (admission.Warnings, error) {
	return nil, nil
}

// loggingNetwork refuses a logging network that does not exist (unless the spec gives the
// configuration to create it from) or whose configuration Multus could not use.
func (v *FaultTolerantVMValidator) loggingNetwork(ctx context.Context, ftvm *ftv1.FaultTolerantVM) (field.ErrorList, admission.Warnings, error) {
	path := field.NewPath("spec", "loggingNetwork", "name")
	ns, name := member.LoggingNetworkKey(ftvm)
	var nad nadv1.NetworkAttachmentDefinition
	err := v.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &nad)
	switch {
	case apierrors.IsNotFound(err):
		if ftvm.Spec.LoggingNetwork.Config != "" {
			return nil, nil, nil // the operator creates it from spec.loggingNetwork.config
		}
		return field.ErrorList{field.NotFound(path, fmt.Sprintf("NetworkAttachmentDefinition %s/%s: create it first, or give spec.loggingNetwork.config for lockstep to create it", ns, name))}, nil, nil
	case meta.IsNoMatchError(err):
		return field.ErrorList{field.Invalid(path, ftvm.Spec.LoggingNetwork.Name, "NetworkAttachmentDefinitions are not served by this cluster: install Multus")}, nil, nil
	case err != nil:
		return nil, nil, fmt.Errorf("reading the logging network %s/%s: %w", ns, name, err)
	}
	if why := validation.CNIConfigProblem(nad.Spec.Config); nad.Spec.Config != "" && why != "" {
		return field.ErrorList{field.Invalid(path, ftvm.Spec.LoggingNetwork.Name, fmt.Sprintf("NetworkAttachmentDefinition %s/%s cannot carry the logging network: %s", ns, name, why))}, nil, nil
	}
	if ftvm.Spec.LoggingNetwork.Config != "" && ftvm.Spec.LoggingNetwork.Config != nad.Spec.Config {
		return nil, admission.Warnings{fmt.Sprintf("NetworkAttachmentDefinition %s/%s exists and is used as it is: spec.loggingNetwork.config is ignored", ns, name)}, nil
	}
	return nil, nil, nil
}

// room refuses a VM that no node could ever hold.
func (v *FaultTolerantVMValidator) room(ctx context.Context, ftvm *ftv1.FaultTolerantVM) (field.ErrorList, admission.Warnings, error) {
	var nodes corev1.NodeList
	if err := v.Reader.List(ctx, &nodes); err != nil {
		return nil, nil, fmt.Errorf("listing nodes: %w", err)
	}
	rooms := make([]validation.Room, 0, len(nodes.Items))
	for i := range nodes.Items {
		n := &nodes.Items[i]
		limits, _ := member.NodeLimits(v.Limits, n)
		rooms = append(rooms, validation.Room{
			Name: n.Name, Limits: limits,
			CPU: n.Status.Allocatable[corev1.ResourceCPU], Memory: n.Status.Allocatable[corev1.ResourceMemory],
		})
	}
	errs, warnings := validation.ValidateRoom(ftvm, member.LogBandwidthMbps(ftvm, v.DefaultLogBandwidthMbps, v.COLO), rooms, v.COLO)
	return errs, warnings, nil
}

// resized says whether an update changes what the VM needs of a node.
func resized(old, ftvm *ftv1.FaultTolerantVM, colo bool) bool {
	oldMem, _ := member.GuestMemory(&old.Spec.Template.Spec)
	newMem, _ := member.GuestMemory(&ftvm.Spec.Template.Spec)
	return member.VCPUs(&old.Spec.Template.Spec) != member.VCPUs(&ftvm.Spec.Template.Spec) ||
		oldMem.Cmp(newMem) != 0 ||
		member.LogBandwidthMbps(old, 0, colo) != member.LogBandwidthMbps(ftvm, 0, colo)
}

// newErrors is what after has that before did not.
func newErrors(before, after field.ErrorList) field.ErrorList {
	had := make(map[string]bool, len(before))
	for _, e := range before {
		had[e.Error()] = true
	}
	var out field.ErrorList
	for _, e := range after {
		if !had[e.Error()] {
			out = append(out, e)
		}
	}
	return out
}

// invalid is the API's Invalid error for a FaultTolerantVM, or nil.
func invalid(ftvm *ftv1.FaultTolerantVM, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(ftv1.GroupVersion.WithKind("FaultTolerantVM").GroupKind(), ftvm.Name, errs)
}
