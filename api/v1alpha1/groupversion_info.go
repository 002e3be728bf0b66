// Package v1alpha1 holds the ft.lockstep.dev/v1alpha1 API: the FaultTolerantVM kind.
//
// +kubebuilder:object:generate=true
// +groupName=ft.lockstep.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "ft.lockstep.dev", Version: "v1alpha1"}

	// SchemeBuilder registers this API's types with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds this API's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &FaultTolerantVM{}, &FaultTolerantVMList{}, &FaultTolerantVMOperation{}, &FaultTolerantVMOperationList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
