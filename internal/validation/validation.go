// Package validation says whether a FaultTolerantVM can be protected. It is pure: the CRD's CEL
// rules reject the simplest cases at admission, and the reconciler runs Validate before it starts
// anything, so a spec that slips past admission is reported in status and nothing runs from it.
package validation

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/member"
)

// MaxNameLength keeps member VMI names (name + "-" + ordinal) within the 63 characters that
// KubeVirt needs for the virt-launcher pod's labels.
const MaxNameLength = 56

// Validate returns every reason the FaultTolerantVM cannot be protected.
func Validate(ftvm *ftv1.FaultTolerantVM) field.ErrorList {
	var errs field.ErrorList
	if len(ftvm.Name) > MaxNameLength {
		errs = append(errs, field.TooLong(field.NewPath("metadata", "name"), ftvm.Name, MaxNameLength))
	}
	spec := field.NewPath("spec", "template", "spec")
	vmi := &ftvm.Spec.Template.Spec
	errs = append(errs, validateResources(vmi, spec.Child("domain"))...)
	errs = append(errs, validateDevices(vmi, spec.Child("domain", "devices"))...)
	errs = append(errs, validateVolumes(vmi, spec.Child("volumes"))...)
	errs = append(errs, validateNetworks(vmi, spec, ftvm)...)
	return errs
}

func validateResources(vmi *virtv1.VirtualMachineInstanceSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if _, ok := member.GuestMemory(vmi); !ok {
		errs = append(errs, field.Required(path.Child("memory", "guest"),
			"the guest memory must be set (memory.guest or resources.requests.memory): FT reserves it in full on both nodes"))
	}
	if cpu := vmi.Domain.CPU; cpu != nil && cpu.MaxSockets > 0 && cpu.MaxSockets != max(cpu.Sockets, 1) {
		errs = append(errs, field.Forbidden(path.Child("cpu", "maxSockets"), "CPU hotplug is not supported for fault tolerant VMs"))
	}
	if mem := vmi.Domain.Memory; mem != nil && mem.MaxGuest != nil && (mem.Guest == nil || mem.MaxGuest.Cmp(*mem.Guest) != 0) {
		errs = append(errs, field.Forbidden(path.Child("memory", "maxGuest"), "memory hotplug is not supported for fault tolerant VMs"))
	}
	return errs
}

func validateDevices(vmi *virtv1.VirtualMachineInstanceSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	d := &vmi.Domain.Devices
	const passthrough = "a passthrough device's state cannot be replicated to the secondary"
	if len(d.GPUs) > 0 {
		errs = append(errs, field.Forbidden(path.Child("gpus"), "GPUs cannot be fault tolerant: "+passthrough))
	}
	if len(d.HostDevices) > 0 {
		errs = append(errs, field.Forbidden(path.Child("hostDevices"), "host devices cannot be fault tolerant: "+passthrough))
	}
	if d.ClientPassthrough != nil {
		errs = append(errs, field.Forbidden(path.Child("clientPassthrough"), "USB client passthrough cannot be fault tolerant: "+passthrough))
	}
	if len(d.Filesystems) > 0 {
		errs = append(errs, field.Forbidden(path.Child("filesystems"), "virtiofs filesystems are shared host state that the secondary cannot replicate; use a disk"))
	}
	return errs
}

func validateVolumes(vmi *virtv1.VirtualMachineInstanceSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, v := range vmi.Volumes {
		p := path.Index(i)
		switch {
		case v.HostDisk != nil:
			errs = append(errs, field.Forbidden(p.Child("hostDisk"), "hostDisk volumes live on one node and cannot be fault tolerant; use a persistentVolumeClaim"))
		case v.DataVolume != nil:
			errs = append(errs, field.Forbidden(p.Child("dataVolume"), "dataVolume volumes are not supported yet; create the PVC first and use persistentVolumeClaim"))
		case v.MemoryDump != nil:
			errs = append(errs, field.Forbidden(p.Child("memoryDump"), "memoryDump volumes are not supported for fault tolerant VMs"))
		case v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.Hotpluggable:
			errs = append(errs, field.Forbidden(p.Child("persistentVolumeClaim", "hotpluggable"), "hotplugged volumes are not supported for fault tolerant VMs"))
		}
	}
	return errs
}

func validateNetworks(vmi *virtv1.VirtualMachineInstanceSpec, path *field.Path, ftvm *ftv1.FaultTolerantVM) field.ErrorList {
	var errs field.ErrorList
	for i, iface := range vmi.Domain.Devices.Interfaces {
		p := path.Child("domain", "devices", "interfaces").Index(i)
		if iface.Name == member.LoggingInterfaceName {
			errs = append(errs, field.Invalid(p.Child("name"), iface.Name, fmt.Sprintf("%q is reserved for the FT logging network", member.LoggingInterfaceName)))
		}
		if iface.SRIOV != nil {
			errs = append(errs, field.Forbidden(p.Child("sriov"), "SR-IOV interfaces are passthrough devices and cannot be fault tolerant; use bridge or masquerade"))
		}
	}
	logging := member.LoggingNetworkRef(ftvm)
	for i, n := range vmi.Networks {
		p := path.Child("networks").Index(i)
		if n.Name == member.LoggingInterfaceName {
			errs = append(errs, field.Invalid(p.Child("name"), n.Name, fmt.Sprintf("%q is reserved for the FT logging network", member.LoggingInterfaceName)))
		}
		if n.Multus != nil && qualified(n.Multus.NetworkName, ftvm.Namespace) == logging {
			errs = append(errs, field.Forbidden(p.Child("multus", "networkName"),
				"the logging network carries lockstepd's replication streams (the VM's whole memory) and is not attached to the guest; give the VM another network"))
		}
	}
	return errs
}

// qualified is a NetworkAttachmentDefinition's "namespace/name", a bare name being in ns.
func qualified(name, ns string) string {
	if strings.Contains(name, "/") {
		return name
	}
	return ns + "/" + name
}
