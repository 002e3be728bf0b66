package adoption

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// legacyVM is a VirtualMachine as an older KubeVirt left it: no firmware UUID and no MAC in its
// spec, a root disk on a DataVolume and a data disk on a claim.
func legacyVM() *virtv1.VirtualMachine {
	return &virtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: "legacy-db", Namespace: "prod"},
		Spec: virtv1.VirtualMachineSpec{
			RunStrategy: ptr.To(virtv1.RunStrategyAlways),
			Template: &virtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      map[string]string{"app": "db", "ft.lockstep.dev/pair": "stale"},
					Annotations: map[string]string{"team": "data"},
				},
				Spec: virtv1.VirtualMachineInstanceSpec{
					Domain: virtv1.DomainSpec{
						Memory: &virtv1.Memory{Guest: ptr.To(resource.MustParse("2Gi"))},
						Devices: virtv1.Devices{Interfaces: []virtv1.Interface{
							{Name: "default", InterfaceBindingMethod: virtv1.InterfaceBindingMethod{Masquerade: &virtv1.InterfaceMasquerade{}}},
							{Name: "fixed", MacAddress: "02:00:00:00:00:0a", InterfaceBindingMethod: virtv1.InterfaceBindingMethod{Bridge: &virtv1.InterfaceBridge{}}},
						}},
					},
					Volumes: []virtv1.Volume{
						{Name: "root", VolumeSource: virtv1.VolumeSource{DataVolume: &virtv1.DataVolumeSource{Name: "legacy-db-root"}}},
						{Name: "data", VolumeSource: virtv1.VolumeSource{PersistentVolumeClaim: &virtv1.PersistentVolumeClaimVolumeSource{
							PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "legacy-db-data"}}}},
						{Name: "cloudinit", VolumeSource: virtv1.VolumeSource{CloudInitNoCloud: &virtv1.CloudInitNoCloudSource{UserData: "#cloud-config"}}},
					},
				},
			},
		},
	}
}

func runningVMI() *virtv1.VirtualMachineInstance {
	return &virtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "legacy-db", Namespace: "prod"},
		Spec: virtv1.VirtualMachineInstanceSpec{Domain: virtv1.DomainSpec{
			Firmware: &virtv1.Firmware{UUID: "5d307ca9-b3ef-428c-8861-06e72d69f223"},
		}},
		Status: virtv1.VirtualMachineInstanceStatus{Interfaces: []virtv1.VirtualMachineInstanceNetworkInterface{
			{Name: "default", MAC: "02:6f:aa:bb:cc:01"},
			{Name: "fixed", MAC: "02:00:00:00:00:0a"},
		}},
	}
}

func TestFirmwareUUIDIsWhatTheGuestSees(t *testing.T) {
	vm := legacyVM()
	// KubeVirt's legacy UUID of the name (Python: uuid.uuid5(UUID("6a1a24a1-..."), "legacy-db")).
	if got := FirmwareUUID(vm, nil); got != "579d2e2a-3022-554e-ae77-34307636ffa1" {
		t.Errorf("legacy firmware UUID of %q: %s", vm.Name, got)
	}
	vm.Spec.Template.Spec.Domain.Firmware = &virtv1.Firmware{UUID: "0e7a3fd8-6c1b-4d77-9a0e-0cf2a1a0b001"}
	if got := FirmwareUUID(vm, nil); got != "0e7a3fd8-6c1b-4d77-9a0e-0cf2a1a0b001" {
		t.Errorf("the spec's firmware UUID: got %s", got)
	}
	if got := FirmwareUUID(vm, runningVMI()); got != "5d307ca9-b3ef-428c-8861-06e72d69f223" {
		t.Errorf("a running VMI's firmware UUID wins: got %s", got)
	}
}

func TestTemplateKeepsTheGuestsIdentity(t *testing.T) {
	vm, vmi := legacyVM(), runningVMI()
	tmpl, err := Template(vm, vmi)
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.Spec.Domain.Firmware.UUID != vmi.Spec.Domain.Firmware.UUID {
		t.Errorf("firmware UUID %s", tmpl.Spec.Domain.Firmware.UUID)
	}
	macs := map[string]string{}
	for _, iface := range tmpl.Spec.Domain.Devices.Interfaces {
		macs[iface.Name] = iface.MacAddress
	}
	if macs["default"] != "02:6f:aa:bb:cc:01" || macs["fixed"] != "02:00:00:00:00:0a" {
		t.Errorf("MACs %v", macs)
	}
	if _, ok := tmpl.Metadata.Labels["ft.lockstep.dev/pair"]; ok || tmpl.Metadata.Labels["app"] != "db" || tmpl.Metadata.Annotations["team"] != "data" {
		t.Errorf("metadata %+v", tmpl.Metadata)
	}
	if vm.Spec.Template.Spec.Domain.Firmware != nil || vm.Spec.Template.Spec.Domain.Devices.Interfaces[0].MacAddress != "" {
		t.Error("the VirtualMachine was changed")
	}
	if changes := IdentityChanges(tmpl, vm, vmi); len(changes) != 0 {
		t.Errorf("the template keeps the identity, yet: %v", changes)
	}

	// Not running, and no MAC in the spec: KubeVirt would give it a new one at its next start.
	tmpl, err = Template(vm, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.Spec.Domain.Devices.Interfaces[0].MacAddress != "" || tmpl.Spec.Domain.Firmware.UUID != FirmwareUUID(vm, nil) {
		t.Errorf("stopped VM: %+v", tmpl.Spec.Domain)
	}
}

func TestIdentityChangesNamesEachDifference(t *testing.T) {
	vm, vmi := legacyVM(), runningVMI()
	tmpl := ftv1.VMITemplate{Spec: *vm.Spec.Template.Spec.DeepCopy()} // written by hand: nothing made explicit
	changes := IdentityChanges(tmpl, vm, vmi)
	if len(changes) != 2 || !strings.Contains(changes[0], "firmware UUID (none") || !strings.Contains(changes[1], "interface default: MAC (none") {
		t.Fatalf("changes %v", changes)
	}
	tmpl.Spec.Domain.Firmware = &virtv1.Firmware{UUID: vmi.Spec.Domain.Firmware.UUID}
	tmpl.Spec.Domain.Devices.Interfaces[1].MacAddress = "02:00:00:00:00:0b"
	changes = IdentityChanges(tmpl, vm, vmi)
	if len(changes) != 2 || !strings.Contains(changes[0], "interface default") || !strings.Contains(changes[1], "interface fixed: MAC 02:00:00:00:00:0b, not 02:00:00:00:00:0a") {
		t.Fatalf("changes %v", changes)
	}
}

func TestTemplateRefusesWhatItCannotHold(t *testing.T) {
	vm := legacyVM()
	vm.Spec.Instancetype = &virtv1.InstancetypeMatcher{Name: "u1.large"}
	if _, err := Template(vm, nil); err == nil || !strings.Contains(err.Error(), "virtctl expand") {
		t.Errorf("instancetype: %v", err)
	}
	vm = legacyVM()
	vm.Spec.Template = nil
	if _, err := Template(vm, nil); err == nil {
		t.Error("no template: no error")
	}
}

func TestFaultTolerantVMAdoptsByName(t *testing.T) {
	vm := legacyVM()
	f, err := FaultTolerantVM(vm, runningVMI(), "ft-logging")
	if err != nil {
		t.Fatal(err)
	}
	if f.Name != "legacy-db" || f.Namespace != "prod" || f.Spec.AdoptFrom.VirtualMachineName != "legacy-db" || f.Spec.LoggingNetwork.Name != "ft-logging" || f.Spec.RunStrategy != "" {
		t.Errorf("%+v", f)
	}
	vm.Spec.RunStrategy = ptr.To(virtv1.RunStrategyHalted)
	if f, _ := FaultTolerantVM(vm, nil, "ft-logging"); f.Spec.RunStrategy != ftv1.RunStrategyHalted {
		t.Errorf("a halted VM is adopted halted: %s", f.Spec.RunStrategy)
	}
}

func TestVirtualMachineRunsOnTheCurrentDisks(t *testing.T) {
	tmpl, err := Template(legacyVM(), runningVMI())
	if err != nil {
		t.Fatal(err)
	}
	ftvm := &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Name: "legacy-db", Namespace: "prod", UID: "f7"}}
	// After a failover the root disk is the copy of the member that went live; data never moved.
	vm := VirtualMachine(ftvm, tmpl, map[string]string{"root": "legacy-db-2-root", "data": "legacy-db-data"})
	if vm.Name != "legacy-db" || vm.Namespace != "prod" || vm.Annotations[AnnotationReleasedFrom] != "f7" || *vm.Spec.RunStrategy != virtv1.RunStrategyAlways {
		t.Errorf("%+v", vm.ObjectMeta)
	}
	vols := vm.Spec.Template.Spec.Volumes
	if vols[0].PersistentVolumeClaim == nil || vols[0].PersistentVolumeClaim.ClaimName != "legacy-db-2-root" || vols[0].DataVolume != nil {
		t.Errorf("root %+v", vols[0].VolumeSource)
	}
	if vols[1].PersistentVolumeClaim.ClaimName != "legacy-db-data" || vols[2].CloudInitNoCloud == nil {
		t.Errorf("volumes %+v", vols)
	}
	if vm.Spec.Template.Spec.Domain.Firmware.UUID != "5d307ca9-b3ef-428c-8861-06e72d69f223" || vm.Spec.Template.ObjectMeta.Labels["app"] != "db" {
		t.Errorf("template %+v", vm.Spec.Template)
	}
	// Without a failover the DataVolume is the current disk, and stays a dataVolume volume.
	vm = VirtualMachine(ftvm, tmpl, map[string]string{"root": "legacy-db-root"})
	if vm.Spec.Template.Spec.Volumes[0].DataVolume == nil {
		t.Errorf("root %+v", vm.Spec.Template.Spec.Volumes[0].VolumeSource)
	}
	ftvm.Spec.RunStrategy = ftv1.RunStrategyHalted
	if vm := VirtualMachine(ftvm, tmpl, nil); *vm.Spec.RunStrategy != virtv1.RunStrategyHalted {
		t.Errorf("halted: %s", *vm.Spec.RunStrategy)
	}
}
