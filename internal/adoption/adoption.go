// Package adoption turns a KubeVirt VirtualMachine into a FaultTolerantVM and a FaultTolerantVM
// back into a VirtualMachine, keeping what the guest sees of its hardware: the firmware UUID and
// the MAC address of each interface. It is pure: kubectl ftvm adopt and the operator read and
// write the objects.
package adoption

import (
	"fmt"
	"maps"
	"sort"
	"strings"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/member"
)

// kubevirtFirmwareNamespace is the namespace UUID of KubeVirt's legacy firmware UUIDs: before
// KubeVirt kept a VM's firmware UUID in its spec, it gave the guest the name-based (v5) UUID of
// the VM's name in this namespace; since then it writes that UUID into the spec of a VM that has
// none when it next starts it, and a new VM gets a random one. A stopped VM of an older KubeVirt
// may still have none: its guest last saw the legacy UUID.
var kubevirtFirmwareNamespace = uuid.MustParse("6a1a24a1-4061-4607-8bf4-a3963d0c5895")

// FirmwareUUID is the firmware UUID that vm's guest sees: its running VMI's (nil when it runs
// none), else the one in vm's spec, else KubeVirt's legacy UUID of vm's name.
func FirmwareUUID(vm *virtv1.VirtualMachine, vmi *virtv1.VirtualMachineInstance) types.UID {
	if vmi != nil && vmi.Spec.Domain.Firmware != nil && vmi.Spec.Domain.Firmware.UUID != "" {
		return vmi.Spec.Domain.Firmware.UUID
	}
	if t := vm.Spec.Template; t != nil && t.Spec.Domain.Firmware != nil && t.Spec.Domain.Firmware.UUID != "" {
		return t.Spec.Domain.Firmware.UUID
	}
	return types.UID(uuid.NewSHA1(kubevirtFirmwareNamespace, []byte(vm.Name)).String())
}

// MACs are the MAC addresses that vm's guest sees, by interface name: the one in vm's spec, else
// the one its running VMI reports. An interface with neither is absent: KubeVirt gives it a new
// MAC at every start, and so will lockstep (one of its own, the same on both members).
func MACs(vm *virtv1.VirtualMachine, vmi *virtv1.VirtualMachineInstance) map[string]string {
	out := map[string]string{}
	if vm.Spec.Template == nil {
		return out
	}
	reported := map[string]string{}
	if vmi != nil {
		for _, iface := range vmi.Status.Interfaces {
			if iface.Name != "" && iface.MAC != "" {
				reported[iface.Name] = iface.MAC
			}
		}
	}
	for _, iface := range vm.Spec.Template.Spec.Domain.Devices.Interfaces {
		switch {
		case iface.MacAddress != "":
			out[iface.Name] = iface.MacAddress
		case reported[iface.Name] != "":
			out[iface.Name] = reported[iface.Name]
		}
	}
	return out
}

// Template is the FaultTolerantVM template of vm: its VMI template, with the firmware UUID and
// the MAC addresses its guest sees made explicit. vmi is its running VMI, or nil.
func Template(vm *virtv1.VirtualMachine, vmi *virtv1.VirtualMachineInstance) (ftv1.VMITemplate, error) {
	if vm.Spec.Instancetype != nil || vm.Spec.Preference != nil {
		return ftv1.VMITemplate{}, fmt.Errorf("VirtualMachine %s uses an instancetype or a preference: a FaultTolerantVM's template holds the whole VM, so expand them into the VirtualMachine first (virtctl expand --vm %s)", vm.Name, vm.Name)
	}
	if vm.Spec.Template == nil {
		return ftv1.VMITemplate{}, fmt.Errorf("VirtualMachine %s has no template", vm.Name)
	}
	t := ftv1.VMITemplate{Spec: *vm.Spec.Template.Spec.DeepCopy()}
	t.Metadata.Labels = withoutReserved(vm.Spec.Template.ObjectMeta.Labels)
	t.Metadata.Annotations = withoutReserved(vm.Spec.Template.ObjectMeta.Annotations)
	if t.Spec.Domain.Firmware == nil {
		t.Spec.Domain.Firmware = &virtv1.Firmware{}
	}
	t.Spec.Domain.Firmware.UUID = FirmwareUUID(vm, vmi)
	macs := MACs(vm, vmi)
	for i := range t.Spec.Domain.Devices.Interfaces {
		iface := &t.Spec.Domain.Devices.Interfaces[i]
		if mac := macs[iface.Name]; mac != "" {
			iface.MacAddress = mac
		}
	}
	return t, nil
}

// withoutReserved drops lockstep's own keys, which a template may not carry (a VirtualMachine
// released by lockstep has none; admission would refuse them).
func withoutReserved(in map[string]string) map[string]string {
	if len(in) == 0 {
		return nil
	}
	out := maps.Clone(in)
	maps.DeleteFunc(out, func(k, _ string) bool { return strings.HasPrefix(k, ftv1.ReservedPrefix) })
	return out
}

// FaultTolerantVM is the FaultTolerantVM that adopts vm (vmi is its running VMI, or nil): of the
// same name, with vm's template (Template) and the given logging network.
func FaultTolerantVM(vm *virtv1.VirtualMachine, vmi *virtv1.VirtualMachineInstance, loggingNetwork string) (*ftv1.FaultTolerantVM, error) {
	t, err := Template(vm, vmi)
	if err != nil {
		return nil, err
	}
	ftvm := &ftv1.FaultTolerantVM{
		TypeMeta:   metav1.TypeMeta{APIVersion: ftv1.GroupVersion.String(), Kind: "FaultTolerantVM"},
		ObjectMeta: metav1.ObjectMeta{Name: vm.Name, Namespace: vm.Namespace},
		Spec: ftv1.FaultTolerantVMSpec{
			AdoptFrom:      &ftv1.AdoptFrom{VirtualMachineName: vm.Name},
			LoggingNetwork: ftv1.LoggingNetwork{Name: loggingNetwork},
			Template:       t,
		},
	}
	if halted(vm) {
		ftvm.Spec.RunStrategy = ftv1.RunStrategyHalted
	}
	return ftvm, nil
}

// halted says whether vm is meant to be stopped.
func halted(vm *virtv1.VirtualMachine) bool {
	if vm.Spec.RunStrategy != nil {
		return *vm.Spec.RunStrategy == virtv1.RunStrategyHalted
	}
	return vm.Spec.Running != nil && !*vm.Spec.Running //nolint:staticcheck // KubeVirt still serves spec.running
}

// IdentityChanges says what a FaultTolerantVM's template changes of what vm's guest sees (vmi is
// its running VMI, or nil): a firmware UUID or a MAC address that differs, one line each; none
// when the template keeps them. lockstep fills what the template leaves empty with its own.
func IdentityChanges(t ftv1.VMITemplate, vm *virtv1.VirtualMachine, vmi *virtv1.VirtualMachineInstance) []string {
	var out []string
	want := FirmwareUUID(vm, vmi)
	var got types.UID
	if t.Spec.Domain.Firmware != nil {
		got = t.Spec.Domain.Firmware.UUID
	}
	if got != want {
		out = append(out, fmt.Sprintf("firmware UUID %s, not %s", orNone(string(got)), want))
	}
	macs := MACs(vm, vmi)
	names := make([]string, 0, len(macs))
	for name := range macs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		got := ""
		for _, iface := range t.Spec.Domain.Devices.Interfaces {
			if iface.Name == name {
				got = iface.MacAddress
			}
		}
		if !strings.EqualFold(got, macs[name]) {
			out = append(out, fmt.Sprintf("interface %s: MAC %s, not %s", name, orNone(got), macs[name]))
		}
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "(none: lockstep's own)"
	}
	return s
}

// AnnotationReleasedFrom, on a VirtualMachine that a FaultTolerantVM was released into, is that
// FaultTolerantVM's UID: the operator made it, and made it once.
const AnnotationReleasedFrom = ftv1.ReservedPrefix + "released-from-uid"

// VirtualMachine is the plain VirtualMachine that ftvm is released into: of its name, with tmpl
// (its template, normalized: the firmware UUID and MAC addresses its members had) on claims,
// each volume's current disk by volume name, and runStrategy Always (Halted when ftvm's is).
func VirtualMachine(ftvm *ftv1.FaultTolerantVM, tmpl ftv1.VMITemplate, claims map[string]string) *virtv1.VirtualMachine {
	spec := *tmpl.Spec.DeepCopy()
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		if claim, ok := claims[v.Name]; ok && member.ClaimOf(v) != "" {
			member.UseClaim(v, claim)
		}
	}
	run := virtv1.RunStrategyAlways
	if ftvm.Spec.RunStrategy == ftv1.RunStrategyHalted {
		run = virtv1.RunStrategyHalted
	}
	return &virtv1.VirtualMachine{
		TypeMeta: metav1.TypeMeta{APIVersion: virtv1.GroupVersion.String(), Kind: "VirtualMachine"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        ftvm.Name,
			Namespace:   ftvm.Namespace,
			Annotations: map[string]string{AnnotationReleasedFrom: string(ftvm.UID)},
		},
		Spec: virtv1.VirtualMachineSpec{
			RunStrategy: &run,
			Template: &virtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: maps.Clone(tmpl.Metadata.Labels), Annotations: maps.Clone(tmpl.Metadata.Annotations)},
				Spec:       spec,
			},
		},
	}
}
