package member

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// COLO is what a member VMI needs for lockstepd's COLO engine (docs/kubevirt.md).
type COLO struct {
	// Enabled makes members COLO members: the overlays, the replicated disk named, a secondary
	// started paused.
	Enabled bool
	// HookSidecarImage is the image that carries cmd/lockstep-kubevirt-hook as
	// /lockstep-kubevirt-hook (lockstep's image), run as each member's hook sidecar (KubeVirt's
	// Sidecar feature gate); empty where the Plugins API brings the hook.
	HookSidecarImage string
	// CPUModel is given to members whose template names no CPU model: both members must show
	// the guest the same CPU, which KubeVirt's default (host-model) does only on identical nodes.
	CPUModel string
	// RunDir is the members' directories' root as QEMU sees it (the hook's --run-dir).
	RunDir string
}

// HookSidecarsAnnotation is KubeVirt's annotation that lists a VMI's hook sidecars.
const HookSidecarsAnnotation = "hooks.kubevirt.io/hookSidecars"

// hookSocket is where the hook sidecar serves, in the directory virt-launcher scans.
const hookSocket = "/var/run/kubevirt-hooks/lockstep.sock"

// applyCOLO adds to a member's VMI what the KubeVirt hook reads and COLO needs:
//   - the replicated disks, every persistent disk of the VM, named in AnnotationReplicatedDisk;
//   - the disks' exact sizes (AnnotationDiskBytes), when known (disksizes.go): on a secondary
//     always, from its primary;
//   - each one's two overlays (Overlays): emptyDisk volumes of its size, on every member so that
//     both VMIs keep one spec (the hook never shows them to the guest);
//   - on a secondary, startStrategy Paused: it waits for its primary's state, and neither
//     KubeVirt nor libvirt may resume it (its RAM cache is in its memory reservation: reserve);
//   - the guest's CPU model, when the template names none and one is configured;
//   - the hook sidecar, when an image is configured.
func applyCOLO(vmi *virtv1.VirtualMachineInstance, m Member, c COLO) error {
	spec := &vmi.Spec
	disks, err := ReplicatedDisks(spec)
	if err != nil {
		return err
	}
	if err := sameCPU(spec, c.CPUModel); err != nil {
		return err
	}
	if m.Role == ftv1.RoleSecondary && m.DiskBytes == nil {
		return fmt.Errorf("a COLO secondary is built from its primary's disk sizes, which are not known")
	}
	exact := DiskBytes{}
	if m.DiskBytes != nil {
		if err := m.DiskBytes.Covers(disks); err != nil {
			return err
		}
		for _, d := range disks {
			exact[d] = m.DiskBytes[d]
		}
		vmi.Annotations[ftv1.AnnotationDiskBytes] = exact.String()
	}
	for i, disk := range disks {
		// The overlays are the disk's size. A primary whose disks' sizes are not known yet (it
		// starts from the template's claims) never uses its own: they have its claims' sizes.
		size, ok := m.DiskSizes[disk]
		if n, known := exact[disk]; known {
			size, ok = *resource.NewQuantity(n, resource.BinarySI), true
		}
		if !ok || size.IsZero() {
			return fmt.Errorf("COLO replicates disk %q, whose claim's size is not known", disk)
		}
		active, hidden := Overlays(i)
		for _, name := range []string{active, hidden} {
			spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, virtv1.Disk{Name: name, DiskDevice: virtv1.DiskDevice{Disk: &virtv1.DiskTarget{Bus: virtv1.DiskBusVirtio}}})
			spec.Volumes = append(spec.Volumes, virtv1.Volume{Name: name, VolumeSource: virtv1.VolumeSource{EmptyDisk: &virtv1.EmptyDiskSource{Capacity: size.DeepCopy()}}})
		}
	}
	vmi.Annotations[ftv1.AnnotationReplicatedDisk] = strings.Join(disks, ",")
	if m.Role == ftv1.RoleSecondary {
		paused := virtv1.StartStrategyPaused
		spec.StartStrategy = &paused
	}
	if c.HookSidecarImage != "" {
		args := []string{"--sidecar-socket", hookSocket}
		if c.RunDir != "" {
			args = append(args, "--run-dir", c.RunDir)
		}
		raw, err := json.Marshal([]map[string]any{{"image": c.HookSidecarImage, "command": []string{"/lockstep-kubevirt-hook"}, "args": args}})
		if err != nil {
			return err
		}
		vmi.Annotations[HookSidecarsAnnotation] = string(raw)
	}
	return nil
}

// reserveRAMCache makes a secondary's memory reservation hold its RAM cache: a COLO secondary's
// QEMU keeps a second copy of the guest's RAM, into which each checkpoint is loaded before it
// reaches the VM. KubeVirt sizes the launcher pod from the VMI's memory request and limit (plus
// its overhead), which the scheduler places and the kernel enforces: with the guest's memory
// alone, the secondary would be killed under its limit as the cache filled. A failover frees the
// cache; the member keeps its reservation (a pod's limits do not change).
func reserveRAMCache(spec *virtv1.VirtualMachineInstanceSpec) {
	guest, _ := GuestMemory(spec)
	both := guest.DeepCopy()
	both.Add(guest)
	spec.Domain.Resources.Requests[corev1.ResourceMemory] = both
	spec.Domain.Resources.Limits[corev1.ResourceMemory] = both.DeepCopy()
}

// WriteBehindPerDisk is what lockstep's QEMU may hold, per replicated disk, of a primary's writes
// that completed before the secondary had them (REPLICATION_WRITE_BEHIND_MAX in
// hack/qemu/replication-primary-write-behind.patch): memory beyond KubeVirt's estimate of QEMU's
// overhead.
const WriteBehindPerDisk = 16 << 20

// reserveWriteBehind adds WriteBehindPerDisk for each replicated disk to a member's memory
// request and limit (the guest's memory stays its own: reserveInFull names it). Every member
// reserves it: a secondary becomes the primary at a failover, and its pod's limits do not change.
func reserveWriteBehind(spec *virtv1.VirtualMachineInstanceSpec) {
	disks, err := ReplicatedDisks(spec)
	if err != nil {
		return // applyCOLO refuses such a VM
	}
	held := resource.NewQuantity(int64(len(disks))*WriteBehindPerDisk, resource.BinarySI)
	for _, l := range []corev1.ResourceList{spec.Domain.Resources.Requests, spec.Domain.Resources.Limits} {
		m := l[corev1.ResourceMemory]
		m.Add(*held)
		l[corev1.ResourceMemory] = m
	}
}

// sameCPU gives the guest a CPU model that both members can show it: the template's, or
// CPUModel. host-passthrough is refused: COLO moves the VM's state between two nodes' CPUs.
func sameCPU(spec *virtv1.VirtualMachineInstanceSpec, model string) error {
	if spec.Domain.CPU == nil {
		spec.Domain.CPU = &virtv1.CPU{}
	}
	if spec.Domain.CPU.Model == virtv1.CPUModeHostPassthrough {
		return fmt.Errorf("CPU model %s: a COLO pair runs the VM on two nodes' CPUs; name a model both nodes have", virtv1.CPUModeHostPassthrough)
	}
	if spec.Domain.CPU.Model == "" {
		spec.Domain.CPU.Model = model
	}
	return nil
}

// ReplicatedDisks are the disks COLO replicates (a disk is named as its volume), in the order of
// the volumes: every volume backed by a claim (a persistentVolumeClaim, or a dataVolume: its
// claim) whose disk (KubeVirt gives a volume without one a disk) is not a CD-ROM. The operator names them in AnnotationReplicatedDisk; the KubeVirt hook
// falls back to them.
func ReplicatedDisks(spec *virtv1.VirtualMachineInstanceSpec) ([]string, error) {
	cdrom := map[string]bool{}
	for _, d := range spec.Domain.Devices.Disks {
		cdrom[d.Name] = d.CDRom != nil
	}
	var disks []string
	for _, v := range spec.Volumes {
		if ClaimOf(&v) != "" && !cdrom[v.Name] {
			disks = append(disks, v.Name)
		}
	}
	if len(disks) == 0 {
		return nil, fmt.Errorf("COLO replicates the disks on claims (persistentVolumeClaim or dataVolume volumes); the template has none")
	}
	return disks, nil
}

// ParseReplicatedDisks reads AnnotationReplicatedDisk: the replicated disks, comma-separated (a
// member made before every disk was replicated names one).
func ParseReplicatedDisks(annotation string) []string {
	var disks []string
	for _, d := range strings.Split(annotation, ",") {
		if d = strings.TrimSpace(d); d != "" {
			disks = append(disks, d)
		}
	}
	return disks
}

// ReplicatedDisksOf are the disks a member VMI replicates: those its AnnotationReplicatedDisk
// names, else those of its spec (ReplicatedDisks).
func ReplicatedDisksOf(vmi *virtv1.VirtualMachineInstance) ([]string, error) {
	if disks := ParseReplicatedDisks(vmi.Annotations[ftv1.AnnotationReplicatedDisk]); len(disks) > 0 {
		return disks, nil
	}
	return ReplicatedDisks(&vmi.Spec)
}

// Overlays are the names of the i-th replicated disk's overlay volumes, active and hidden: those
// of the first are DiskColoActive and DiskColoHidden (as members had them when only one disk was
// replicated), the others' carry the index.
func Overlays(i int) (active, hidden string) {
	if i == 0 {
		return ftv1.DiskColoActive, ftv1.DiskColoHidden
	}
	n := "-" + strconv.Itoa(i)
	return ftv1.DiskColoActive + n, ftv1.DiskColoHidden + n
}
