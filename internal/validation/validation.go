// Package validation says whether a FaultTolerantVM can be protected. It is pure: the admission
// webhook (internal/admission) runs these rules before an object is stored, the CRD's CEL rules
// repeat the simplest where the webhook is not installed, and the reconciler runs Validate before
// it starts anything, so a spec that slips past admission is reported in status and nothing runs
// from it.
package validation

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
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
	errs = append(errs, validateName(ftvm.Name)...)
	errs = append(errs, validateLoggingNetwork(&ftvm.Spec.LoggingNetwork, field.NewPath("spec", "loggingNetwork"))...)
	errs = append(errs, validateTemplateMeta(&ftvm.Spec.Template.Metadata, field.NewPath("spec", "template", "metadata"))...)
	spec := field.NewPath("spec", "template", "spec")
	vmi := &ftvm.Spec.Template.Spec
	errs = append(errs, validateResources(vmi, spec.Child("domain"))...)
	errs = append(errs, validateReservation(vmi, spec.Child("domain"))...)
	errs = append(errs, validateFirmware(vmi, spec.Child("domain"))...)
	errs = append(errs, validateDevices(vmi, spec.Child("domain", "devices"))...)
	errs = append(errs, validateDisks(vmi, spec.Child("domain", "devices", "disks"))...)
	errs = append(errs, validateVolumes(vmi, spec.Child("volumes"))...)
	errs = append(errs, validateNetworks(vmi, spec, ftvm)...)
	errs = append(errs, validateComparedNIC(vmi, spec)...)
	errs = append(errs, validateProbes(vmi, spec)...)
	return errs
}

// validateTemplateMeta refuses labels and annotations of lockstep's own (ReservedPrefix) in the
// template: lockstep sets them on each member, and one given by the template would say what no
// writer decided (that a new secondary holds the VM's state, whose replicas its disks hold).
func validateTemplateMeta(meta *ftv1.VMITemplateMeta, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, keys := range []struct {
		child string
		m     map[string]string
	}{{"labels", meta.Labels}, {"annotations", meta.Annotations}} {
		names := make([]string, 0, len(keys.m))
		for k := range keys.m {
			if strings.HasPrefix(k, ftv1.ReservedPrefix) {
				names = append(names, k)
			}
		}
		sort.Strings(names)
		for _, k := range names {
			errs = append(errs, field.Forbidden(path.Child(keys.child).Key(k),
				fmt.Sprintf("keys under %s are lockstep's own: it sets them on each member", ftv1.ReservedPrefix)))
		}
	}
	return errs
}

// validateName: members are VMIs named <name>-<ordinal>, and KubeVirt puts a VMI's name in its
// launcher pod's labels and uses it as the guest's hostname, so the name is a DNS label short
// enough to take the ordinal.
func validateName(name string) field.ErrorList {
	path := field.NewPath("metadata", "name")
	if len(name) > MaxNameLength {
		return field.ErrorList{field.TooLong(path, name, MaxNameLength)}
	}
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(name) {
		errs = append(errs, field.Invalid(path, name, msg+": the members' VMIs are named <name>-<ordinal> and their hostnames must be DNS labels"))
	}
	return errs
}

// validateLoggingNetwork checks a CNI configuration that the operator would create the logging
// network from; an existing network's own configuration is the webhook's to read.
func validateLoggingNetwork(n *ftv1.LoggingNetwork, path *field.Path) field.ErrorList {
	if n.Config == "" {
		return nil
	}
	if why := CNIConfigProblem(n.Config); why != "" {
		return field.ErrorList{field.Invalid(path.Child("config"), "(CNI configuration)", why)}
	}
	return nil
}

// CNIConfigProblem says why a CNI configuration (a NetworkAttachmentDefinition's spec.config)
// cannot carry the logging network, or "" when it can: it must be a JSON object with a
// cniVersion and a type (or a plugins list), as Multus requires.
func CNIConfigProblem(config string) string {
	var conf struct {
		CNIVersion string            `json:"cniVersion"`
		Type       string            `json:"type"`
		Plugins    []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(config), &conf); err != nil {
		return "not a JSON object: " + err.Error()
	}
	if conf.CNIVersion == "" {
		return `the CNI configuration has no "cniVersion"`
	}
	if conf.Type == "" && len(conf.Plugins) == 0 {
		return `the CNI configuration has neither a "type" nor a "plugins" list`
	}
	return ""
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

// validateReservation: FT reserves the guest's memory and CPUs in full on both nodes (white paper
// 2.1), so a template that asks for less than the guest uses, or overcommits it, is refused
// rather than silently changed.
func validateReservation(vmi *virtv1.VirtualMachineInstanceSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	res := &vmi.Domain.Resources
	rpath := path.Child("resources")
	if res.OvercommitGuestOverhead {
		errs = append(errs, field.Forbidden(rpath.Child("overcommitGuestOverhead"),
			"FT reserves the guest's memory and its overhead in full on both nodes; remove overcommitGuestOverhead"))
	}
	if guest, ok := member.GuestMemory(vmi); ok {
		for _, side := range []struct {
			name string
			list corev1.ResourceList
		}{{"requests", res.Requests}, {"limits", res.Limits}} {
			if q, set := side.list[corev1.ResourceMemory]; set && q.Cmp(guest) != 0 {
				errs = append(errs, field.Invalid(rpath.Child(side.name, "memory"), q.String(),
					fmt.Sprintf("FT reserves the guest memory in full: set it to the guest memory (%s) or leave it out", guest.String())))
			}
		}
	}
	vcpus := member.VCPUs(vmi)
	for _, side := range []struct {
		name string
		list corev1.ResourceList
	}{{"requests", res.Requests}, {"limits", res.Limits}} {
		q, set := side.list[corev1.ResourceCPU]
		if set && q.MilliValue() != int64(vcpus)*1000 {
			errs = append(errs, field.Invalid(rpath.Child(side.name, "cpu"), q.String(),
				fmt.Sprintf("FT reserves a whole host CPU per vCPU: set it to the vCPU count (%d) or leave it out", vcpus)))
		}
	}
	return errs
}

// validateFirmware refuses firmware state that lives outside the VM's memory and disks.
func validateFirmware(vmi *virtv1.VirtualMachineInstanceSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if fw := vmi.Domain.Firmware; fw != nil && fw.Bootloader != nil && fw.Bootloader.EFI != nil &&
		fw.Bootloader.EFI.Persistent != nil && *fw.Bootloader.EFI.Persistent {
		errs = append(errs, field.Forbidden(path.Child("firmware", "bootloader", "efi", "persistent"),
			"persistent EFI variables live in one VM's backend storage, which the secondary cannot have; leave persistent unset"))
	}
	if ls := vmi.Domain.LaunchSecurity; ls != nil {
		errs = append(errs, field.Forbidden(path.Child("launchSecurity"),
			"confidential VMs (SEV, SNP, TDX) encrypt their memory with a key of one host, so it cannot be replicated"))
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
	if d.TPM != nil && d.TPM.Persistent != nil && *d.TPM.Persistent {
		errs = append(errs, field.Forbidden(path.Child("tpm", "persistent"),
			"a persistent TPM keeps its state in one VM's backend storage, which the secondary cannot have; leave persistent unset"))
	}
	if d.DownwardMetrics != nil {
		errs = append(errs, field.Forbidden(path.Child("downwardMetrics"),
			"downward metrics show each member its own host, so the two copies of the guest would read different values; remove it"))
	}
	return errs
}

// validateDisks refuses disks that a member cannot have a copy of its own of.
func validateDisks(vmi *virtv1.VirtualMachineInstanceSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, d := range vmi.Domain.Devices.Disks {
		p := path.Index(i)
		if d.LUN != nil {
			if d.LUN.Reservation {
				errs = append(errs, field.Forbidden(p.Child("lun", "reservation"),
					"SCSI persistent reservations belong to one host's initiator and cannot move to the secondary; use a disk of type disk"))
			} else {
				errs = append(errs, field.Forbidden(p.Child("lun"),
					"a LUN passes SCSI commands to one host's device, outside the replication; use a disk of type disk"))
			}
		}
		if d.Shareable != nil && *d.Shareable {
			errs = append(errs, field.Forbidden(p.Child("shareable"),
				"each member keeps its own copy of every disk, so a disk cannot be shared with other VMs"))
		}
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
		case v.DataVolume != nil && v.DataVolume.Hotpluggable:
			errs = append(errs, field.Forbidden(p.Child("dataVolume", "hotpluggable"), "hotplugged volumes are not supported for fault tolerant VMs"))
		case v.MemoryDump != nil:
			errs = append(errs, field.Forbidden(p.Child("memoryDump"), "memoryDump volumes are not supported for fault tolerant VMs"))
		case v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.Hotpluggable:
			errs = append(errs, field.Forbidden(p.Child("persistentVolumeClaim", "hotpluggable"), "hotplugged volumes are not supported for fault tolerant VMs"))
		case v.CloudInitConfigDrive != nil:
			// KubeVirt gives a config drive the instance_id <VMI name>.<namespace>, and the members
			// are VMIs of their own names: after a failover, the next boot would find a new
			// instance and run cloud-init's per-instance modules again (new SSH host keys, users).
			// NoCloud's instance-id is the firmware UUID, which both members share.
			errs = append(errs, field.Forbidden(p.Child("cloudInitConfigDrive"),
				"a config drive's instance_id is the VMI's name, which differs between the two members, so the guest would take itself for a new instance after a failover; use cloudInitNoCloud (its instance-id is the firmware UUID, the same on both)"))
		case v.DownwardMetrics != nil:
			errs = append(errs, field.Forbidden(p.Child("downwardMetrics"),
				"downward metrics show each member its own host, so the two copies of the guest would read different values; remove it"))
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

// validateComparedNIC: COLO releases what the guest sends only once the secondary's guest sent the
// same (colo-compare), which QEMU's packet filters see on one NIC with one queue and no vhost (the
// KubeVirt hook turns vhost off; netfilter refuses a multiqueue backend). The NIC's identity must
// also move with the VM: bridge binding on the pod network hands the guest the launcher pod's own
// address with an infinite DHCP lease, which the secondary's pod does not have.
func validateComparedNIC(vmi *virtv1.VirtualMachineInstanceSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	devices := path.Child("domain", "devices")
	if mq := vmi.Domain.Devices.NetworkInterfaceMultiQueue; mq != nil && *mq {
		errs = append(errs, field.Forbidden(devices.Child("networkInterfaceMultiqueue"),
			"COLO compares the packets of a NIC with one queue (QEMU's packet filters refuse a multiqueue backend); remove networkInterfaceMultiqueue"))
	}
	if n := len(vmi.Domain.Devices.Interfaces); n > 1 {
		errs = append(errs, field.Forbidden(devices.Child("interfaces"),
			fmt.Sprintf("COLO compares the packets of one NIC; the template has %d: keep one (on an L2 network, so that the secondary takes over its address)", n)))
	}
	pod := map[string]bool{}
	for _, n := range vmi.Networks {
		pod[n.Name] = n.Pod != nil
	}
	for i, iface := range vmi.Domain.Devices.Interfaces {
		if iface.Bridge != nil && pod[iface.Name] {
			errs = append(errs, field.Forbidden(devices.Child("interfaces").Index(i).Child("bridge"),
				"bridge binding on the pod network gives the guest its launcher pod's address with an infinite DHCP lease, and the secondary's pod has another one: after a failover the guest would keep an address that is no longer its own; use masquerade on the pod network, or bridge on a Multus L2 network"))
		}
	}
	return errs
}

// validateProbes: a member's probes would go to its own launcher pod, and a COLO secondary's guest
// answers only the primary's mirrored traffic (its replies go to colo-compare, not to the prober).
// Its liveness probe would fail, and KubeVirt would restart the secondary, again and again; its
// readiness would never be true. lockstepd watches both members instead (docs/operator.md).
func validateProbes(vmi *virtv1.VirtualMachineInstanceSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	const why = "a COLO secondary's guest answers only the primary's mirrored traffic, so a probe of the secondary fails (and KubeVirt would restart it); lockstepd watches both members: remove it"
	if vmi.LivenessProbe != nil {
		errs = append(errs, field.Forbidden(path.Child("livenessProbe"), "liveness probes are not supported on fault tolerant VMs: "+why))
	}
	if vmi.ReadinessProbe != nil {
		errs = append(errs, field.Forbidden(path.Child("readinessProbe"), "readiness probes are not supported on fault tolerant VMs: "+why))
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
