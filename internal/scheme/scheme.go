// Package scheme is the one runtime.Scheme of lockstep's binaries: every API type the operator,
// lockstepd and the tests read or write. It links no controller, so the daemon takes it without
// the operator's reconciler or metrics.
package scheme

import (
	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// New knows the Kubernetes, lockstep, KubeVirt and NetworkAttachmentDefinition types.
func New() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(ftv1.AddToScheme(s))
	utilruntime.Must(virtv1.AddToScheme(s))
	utilruntime.Must(nadv1.AddToScheme(s))
	return s
}
