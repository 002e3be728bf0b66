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
	if err == nil || !strings.Contains(err.Error(), "spec.template.spec.volumes[1].containerDisk") || !strings.Contains(err.Error(), "import the image into a DataVolume") {
		t.Fatalf("with COLO: %v, want the containerDisk refused with what to do instead", err)
	}
	changed := ftvm.DeepCopy()
	changed.Labels = map[string]string{"team": "mail"}
	if _, err := colo.ValidateUpdate(ctx, ftvm, changed); err != nil {
		t.Fatalf("an update that leaves the containerDisk as it was: %v", err)
	}
}

// TestCOLORefusesABlockModeClaim: under COLO a block-mode claim is refused at admission, with the
// volume and what to use; a claim that does not exist yet passes (the operator checks it when it
// does), and so does a filesystem claim; an update that brings in a block claim is refused.
func TestCOLORefusesABlockModeClaim(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, nadv1.AddToScheme, ftv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	block, fs := corev1.PersistentVolumeBlock, corev1.PersistentVolumeFilesystem
	claim := func(name string, mode *corev1.PersistentVolumeMode) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: name}, Spec: corev1.PersistentVolumeClaimSpec{VolumeMode: mode}}
	}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourceMemory: resource.MustParse("64Gi")}}},
		&nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "ft-logging"}},
		claim("root", &fs), claim("raw", &block)).Build()
	guest := resource.MustParse("1Gi")
	vm := func(claims ...string) *ftv1.FaultTolerantVM {
		f := &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "vm"}, Spec: ftv1.FaultTolerantVMSpec{
			LoggingNetwork: ftv1.LoggingNetwork{Name: "ft-logging"},
			Template:       ftv1.VMITemplate{Spec: virtv1.VirtualMachineInstanceSpec{Domain: virtv1.DomainSpec{Memory: &virtv1.Memory{Guest: &guest}}}},
		}}
		for _, c := range claims {
			f.Spec.Template.Spec.Volumes = append(f.Spec.Template.Spec.Volumes, virtv1.Volume{Name: c, VolumeSource: virtv1.VolumeSource{
				DataVolume: &virtv1.DataVolumeSource{Name: c}}})
		}
		ftv1.Default(f)
		return f
	}
	v := &FaultTolerantVMValidator{Reader: reader, Claims: reader, Limits: placement.Limits{MaxMembers: 4, MaxVCPUs: 8}, COLO: true}
	ctx := context.Background()
	if _, err := v.ValidateCreate(ctx, vm("root", "not-yet")); err != nil {
		t.Fatalf("a filesystem claim and one not made yet: %v", err)
	}
	_, err := v.ValidateCreate(ctx, vm("root", "raw"))
	if err == nil || !strings.Contains(err.Error(), "spec.template.spec.volumes[1]") || !strings.Contains(err.Error(), "volumeMode Filesystem") {
		t.Fatalf("a block claim: %v, want it refused with what to use", err)
	}
	if _, err := v.ValidateUpdate(ctx, vm("root"), vm("root", "raw")); err == nil || !strings.Contains(err.Error(), "block-mode") {
		t.Fatalf("an update that adds a block claim: %v, want it refused", err)
	}
	plain := &FaultTolerantVMValidator{Reader: reader, Claims: reader, Limits: placement.Limits{MaxMembers: 4, MaxVCPUs: 8}}
	if _, err := plain.ValidateCreate(ctx, vm("root", "raw")); err != nil {
		t.Fatalf("without COLO a block claim passes: %v", err)
	}
}

// TestOneAdopterPerVirtualMachine: a second FaultTolerantVM that adopts a VirtualMachine another
// one adopts is refused (both would start a pair on its disks once it is gone).
func TestOneAdopterPerVirtualMachine(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, nadv1.AddToScheme, ftv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	guest := resource.MustParse("1Gi")
	adopter := func(name, vm string) *ftv1.FaultTolerantVM {
		f := &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: name}, Spec: ftv1.FaultTolerantVMSpec{
			AdoptFrom:      &ftv1.AdoptFrom{VirtualMachineName: vm},
			LoggingNetwork: ftv1.LoggingNetwork{Name: "ft-logging"},
			Template:       ftv1.VMITemplate{Spec: virtv1.VirtualMachineInstanceSpec{Domain: virtv1.DomainSpec{Memory: &virtv1.Memory{Guest: &guest}}}},
		}}
		ftv1.Default(f)
		return f
	}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(adopter("first", "legacy"),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}},
		&nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "ft-logging"}}).Build()
	v := &FaultTolerantVMValidator{Reader: reader, Limits: placement.Limits{MaxMembers: 4, MaxVCPUs: 8}}
	_, err := v.ValidateCreate(context.Background(), adopter("second", "legacy"))
	if err == nil || !strings.Contains(err.Error(), "spec.adoptFrom.virtualMachineName") || !strings.Contains(err.Error(), "FaultTolerantVM first adopts VirtualMachine legacy already") {
		t.Fatalf("a second adopter: %v", err)
	}
	if _, err := v.ValidateCreate(context.Background(), adopter("other", "another")); err != nil && strings.Contains(err.Error(), "adoptFrom") {
		t.Fatalf("another VirtualMachine: %v", err)
	}
}

// TestCOLOWarnsOfAnExpectedLoadThatSizesNothing: with COLO members, spec.expectedLoad's disk
// reads size nothing (each member reads its own disks): admission says so on create, and on an
// update that changes the expected load, and reserves by what COLO sends; without COLO the same
// VM passes without a warning.
func TestCOLOWarnsOfAnExpectedLoadThatSizesNothing(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, nadv1.AddToScheme, ftv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourceMemory: resource.MustParse("64Gi")}}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}, Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourceMemory: resource.MustParse("64Gi")}}},
		&nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "ft-logging"}}).Build()
	guest := resource.MustParse("1Gi")
	ftvm := &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "vm"}, Spec: ftv1.FaultTolerantVMSpec{
		LoggingNetwork: ftv1.LoggingNetwork{Name: "ft-logging"},
		ExpectedLoad:   &ftv1.ExpectedLoad{DiskReadMBps: 100, NetworkReceiveMbps: 20, MemoryDirtyMBps: 1},
		Template: ftv1.VMITemplate{Spec: virtv1.VirtualMachineInstanceSpec{
			Domain: virtv1.DomainSpec{Memory: &virtv1.Memory{Guest: &guest}},
			Volumes: []virtv1.Volume{{Name: "root", VolumeSource: virtv1.VolumeSource{PersistentVolumeClaim: &virtv1.PersistentVolumeClaimVolumeSource{
				PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "root"}}}}},
		}},
	}}
	ftv1.Default(ftvm)
	// A budget that the white paper's formula would exceed ((100*8 + 20) * 1.2 = 984) and COLO's does not (34).
	limits := placement.Limits{MaxMembers: 4, MaxVCPUs: 8, LogBandwidthMbps: 500}
	ctx := context.Background()
	colo := &FaultTolerantVMValidator{Reader: reader, Limits: limits, COLO: true}
	warnings, err := colo.ValidateCreate(ctx, ftvm)
	if err != nil || !strings.Contains(strings.Join(warnings, "\n"), "diskReadMBps sizes nothing with COLO") {
		t.Fatalf("with COLO: warnings %q, %v; want the disk reads named, and the VM admitted", warnings, err)
	}
	changed := ftvm.DeepCopy()
	changed.Spec.ExpectedLoad.DiskReadMBps = 50
	if warnings, err := colo.ValidateUpdate(ctx, ftvm, changed); err != nil || !strings.Contains(strings.Join(warnings, "\n"), "diskReadMBps sizes nothing with COLO") {
		t.Fatalf("an update of the expected load with COLO: warnings %q, %v; want the warning again", warnings, err)
	}
	plain := &FaultTolerantVMValidator{Reader: reader, Limits: limits}
	if _, err := plain.ValidateCreate(ctx, ftvm); err == nil || !strings.Contains(err.Error(), "the logging bandwidth budget is 500 Mbit/s") {
		t.Fatalf("without COLO: %v, want the VM refused for the white paper's 984 Mbit/s", err)
	}
}
