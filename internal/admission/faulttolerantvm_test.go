package admission

import (
	"context"
	"strings"
	"testing"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/placement"
)

// TestCOLORefusesWhatItCannotReplicate: with COLO members (--colo, the default install), a
// containerDisk beside the claim is refused on create, with its field and what to use; without
// COLO it passes. An update that leaves such a volume as it was is not refused for it.
func TestCOLORefusesWhatItCannotReplicate(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, nadv1.AddToScheme, ftv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	node := func(name string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourceMemory: resource.MustParse("64Gi")}}}
	}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(node("n1"), node("n2"),
		&nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "ft-logging"}}).Build()
	guest := resource.MustParse("1Gi")
	ftvm := &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "vm"}, Spec: ftv1.FaultTolerantVMSpec{
		LoggingNetwork: ftv1.LoggingNetwork{Name: "ft-logging"},
		Template: ftv1.VMITemplate{Spec: virtv1.VirtualMachineInstanceSpec{
			Domain: virtv1.DomainSpec{Memory: &virtv1.Memory{Guest: &guest}},
			Volumes: []virtv1.Volume{
				{Name: "root", VolumeSource: virtv1.VolumeSource{PersistentVolumeClaim: &virtv1.PersistentVolumeClaimVolumeSource{
					PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "root"}}}},
				{Name: "tools", VolumeSource: virtv1.VolumeSource{ContainerDisk: &virtv1.ContainerDiskSource{Image: "quay.io/tools"}}},
			},
		}},
	}}
	ftv1.Default(ftvm)
	limits := placement.Limits{MaxMembers: 4, MaxVCPUs: 8}
	ctx := context.Background()
	plain := &FaultTolerantVMValidator{Reader: reader, Limits: limits}
	if _, err := plain.ValidateCreate(ctx, ftvm); err != nil {
		t.Fatalf("without COLO: %v", err)
	}
	colo := &FaultTolerantVMValidator{Reader: reader, Limits: limits, COLO: true}
	_, err := colo.ValidateCreate(ctx, ftvm)
	if err == nil || !strings.Contains(err.Error(), "spec.template.spec.volumes[1].containerDisk") || !strings.Contains(err.Error(), "import the image into a claim") {
		t.Fatalf("with COLO: %v, want the containerDisk refused with what to do instead", err)
	}
	changed := ftvm.DeepCopy()
	changed.Labels = map[string]string{"team": "mail"}
	if _, err := colo.ValidateUpdate(ctx, ftvm, changed); err != nil {
		t.Fatalf("an update that leaves the containerDisk as it was: %v", err)
	}
}
