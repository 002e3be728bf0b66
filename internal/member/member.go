// Package member builds the VirtualMachineInstance of one member of a fault tolerant pair from a
// FaultTolerantVM. It is pure: the controller decides the name, role, node and disk claims, and
// this package turns them and the template into a VMI with full reservations, anti-affinity and
// the node pin. The logging network is lockstepd's, not the guest's: no member has a NIC on it.
package member

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/kubevirtsize"
)

// LoggingInterfaceName is reserved: no member has a NIC of that name. The logging network is
// lockstepd's, not the guest's (the COLO stream carries the VM's whole memory).
const LoggingInterfaceName = "ft-logging"

// HostnameTopologyKey keeps the two members on different nodes.
const HostnameTopologyKey = corev1.LabelHostname

// Options are cluster-wide settings of the operator.
type Options struct {
	// PriorityClassName is given to members whose template names none.
	PriorityClassName string
	// DedicatedCPUPlacement pins each vCPU to a host CPU; the cluster must run the CPU manager.
	DedicatedCPUPlacement bool
	// COLO makes members COLO members for lockstepd's COLO engine and the KubeVirt hook.
	COLO COLO
}

// Member is what the controller decided for one member.
type Member struct {
	Ordinal int
	Role    string
	Node    string
	// Claims maps a volume name to the claim this member uses for it (its own copy of the disk).
	Claims map[string]string
	// DiskSizes maps a volume name to the size of its claim.
	DiskSizes map[string]resource.Quantity
	// DiskBytes, under COLO, is the exact size of each replicated disk, when known: always on a
	// secondary (its primary's), on a primary only when it starts from copies made for it.
	DiskBytes DiskBytes
	Since     time.Time
	// LogBandwidthMbps is the logging bandwidth placement reserved for the member.
	LogBandwidthMbps int
	// Epoch, on a primary, is the epoch of the pair's record at which it took the role.
	Epoch int64
	// Follows, on a secondary, is the primary it is started beside.
	Follows string
	// ReplicaOf, on a secondary that took over an earlier secondary's copies of the disks, names
	// that secondary (ftv1.AnnotationReplicaOf).
	ReplicaOf string
}

// Name is the VMI name of a pair's member with the given ordinal.
func Name(ftvmName string, ordinal int) string {
	return fmt.Sprintf("%s-%d", ftvmName, ordinal)
}

// Hostname is the guest hostname of every member of the FaultTolerantVM name: its first DNS
// label, at most 63 characters (a FaultTolerantVM's name may be a DNS subdomain).
func Hostname(name string) string {
	label, _, _ := strings.Cut(name, ".")
	if len(label) > 63 {
		label = label[:63]
	}
	return strings.TrimRight(label, "-")
}

// Normalize returns the template with what must be equal on both members made explicit: the
// firmware UUID and the MAC address of every interface, derived from the FaultTolerantVM's UID.
// Without them each member would get its own, and the guest would see its hardware change at
// failover.
func Normalize(uid types.UID, t ftv1.VMITemplate) ftv1.VMITemplate {
	t = *t.DeepCopy()
	if t.Spec.Domain.Firmware == nil {
		t.Spec.Domain.Firmware = &virtv1.Firmware{}
	}
	if t.Spec.Domain.Firmware.UUID == "" {
		t.Spec.Domain.Firmware.UUID = uid
	}
	for i := range t.Spec.Domain.Devices.Interfaces {
		iface := &t.Spec.Domain.Devices.Interfaces[i]
		if iface.MacAddress == "" {
			iface.MacAddress = stableMAC(string(uid), iface.Name)
		}
	}
	return t
}

// stableMAC is a locally administered unicast MAC derived from its inputs.
func stableMAC(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	b := h.Sum(nil)[:6]
	b[0] = (b[0] | 0x02) &^ 0x01
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3], b[4], b[5])
}

// EncodeTemplate is the canonical JSON of a template and its hash.
func EncodeTemplate(t ftv1.VMITemplate) (string, string, error) {
	raw, err := json.Marshal(t)
	if err != nil {
		return "", "", err
	}
	sum := sha256.Sum256(raw)
	return string(raw), hex.EncodeToString(sum[:8]), nil
}

// DecodeTemplate reads the template a member was built from.
func DecodeTemplate(vmi *virtv1.VirtualMachineInstance) (ftv1.VMITemplate, error) {
	var t ftv1.VMITemplate
	raw, ok := vmi.Annotations[ftv1.AnnotationTemplate]
	if !ok {
		return t, fmt.Errorf("member %s has no %s annotation", vmi.Name, ftv1.AnnotationTemplate)
	}
	if err := json.Unmarshal([]byte(raw), &t); err != nil {
		return t, fmt.Errorf("member %s: decoding %s: %w", vmi.Name, ftv1.AnnotationTemplate, err)
	}
	return t, nil
}

// Build makes the VMI of a member. tmpl is a normalized template: the FaultTolerantVM's for a new
// pair, the surviving member's for its new partner.
func Build(ftvm *ftv1.FaultTolerantVM, tmpl ftv1.VMITemplate, m Member, opts Options) (*virtv1.VirtualMachineInstance, error) {
	raw, hash, err := EncodeTemplate(tmpl)
	if err != nil {
		return nil, err
	}
	spec := *tmpl.Spec.DeepCopy()
	reserve(&spec, m.Role, opts)
	if spec.PriorityClassName == "" {
		spec.PriorityClassName = opts.PriorityClassName
	}
	external := virtv1.EvictionStrategyExternal
	spec.EvictionStrategy = &external
	if spec.Hostname == "" {
		// KubeVirt names the guest after its VMI: the members, and a VM restarted from its disks,
		// would each give the guest another hostname.
		spec.Hostname = Hostname(ftvm.Name)
	}
	spec.Affinity = pinAndSeparate(spec.Affinity, ftvm, m.Node)
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		if claim, ok := m.Claims[v.Name]; ok && ClaimOf(v) != "" {
			UseClaim(v, claim)
		}
	}

	vmi := &virtv1.VirtualMachineInstance{
		TypeMeta: metav1.TypeMeta{APIVersion: virtv1.GroupVersion.String(), Kind: "VirtualMachineInstance"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        Name(ftvm.Name, m.Ordinal),
			Namespace:   ftvm.Namespace,
			Labels:      map[string]string{},
			Annotations: map[string]string{},
		},
		Spec: spec,
	}
	// Keys of lockstep's own are its to set (admission refuses them in a template): one copied
	// from a template would say what no writer decided, such as that a new secondary holds state.
	for k, v := range tmpl.Metadata.Labels {
		if !strings.HasPrefix(k, ftv1.ReservedPrefix) {
			vmi.Labels[k] = v
		}
	}
	for k, v := range tmpl.Metadata.Annotations {
		if !strings.HasPrefix(k, ftv1.ReservedPrefix) {
			vmi.Annotations[k] = v
		}
	}
	vmi.Labels[ftv1.LabelPair] = ftvm.Name
	vmi.Labels[ftv1.LabelRole] = m.Role
	vmi.Labels[ftv1.LabelNode] = m.Node
	vmi.Labels[ftv1.LabelManagedBy] = ftv1.ManagedByValue
	vmi.Annotations[ftv1.AnnotationOrdinal] = strconv.Itoa(m.Ordinal)
	vmi.Annotations[ftv1.AnnotationRoleSince] = m.Since.UTC().Format(time.RFC3339)
	vmi.Annotations[ftv1.AnnotationTemplate] = raw
	vmi.Annotations[ftv1.AnnotationTemplateHash] = hash
	vmi.Annotations[ftv1.AnnotationReservedLogBandwidth] = strconv.Itoa(m.LogBandwidthMbps)
	if m.Epoch > 0 {
		vmi.Annotations[ftv1.AnnotationEpoch] = strconv.FormatInt(m.Epoch, 10)
	}
	if m.Follows != "" {
		vmi.Annotations[ftv1.AnnotationFollows] = m.Follows
	}
	if m.ReplicaOf != "" {
		vmi.Annotations[ftv1.AnnotationReplicaOf] = m.ReplicaOf
	}
	if opts.COLO.Enabled {
		if err := applyCOLO(vmi, m, opts.COLO); err != nil {
			return nil, err
		}
	}
	return vmi, nil
}

// noHotplug pins a member's guest memory and CPU sockets to what it has. KubeVirt's defaults
// (virt-api's VMI mutator, under the default VM rollout strategy LiveUpdate) give every VMI that
// names no maximum room to hot-plug into: four times its guest memory (the domain's maxMemory)
// and four times its sockets (vCPUs defined but disabled). A member is never hot-plugged
// (admission refuses hotplug in a template), and the COLO tiers run the domain without that room:
// so the maximum is named, equal to what the member has, and KubeVirt adds nothing
// (test/kubevirt, against virt-api). A template that names no sockets keeps none: KubeVirt's
// room is its sockets times four, none, unless the cluster sets liveUpdateConfiguration's
// maxCpuSockets (docs/kubevirt.md), and a maximum of one would make KubeVirt list every vCPU in
// the domain.
func noHotplug(d *virtv1.DomainSpec) {
	guest := d.Memory.Guest.DeepCopy()
	d.Memory.MaxGuest = &guest
	if d.CPU != nil && d.CPU.Sockets > 0 {
		d.CPU.MaxSockets = d.CPU.Sockets
	}
}

// reserveInFull makes every resource a reservation (paper 2.1): guest memory == memory request ==
// limit, CPU request == limit == vCPUs, so that the pod is of Guaranteed QoS and the secondary
// never runs short of what the primary has.
func reserveInFull(spec *virtv1.VirtualMachineInstanceSpec, opts Options) {
	mem, _ := GuestMemory(spec)
	cpus := resource.MustParse(strconv.Itoa(VCPUs(spec)))
	d := &spec.Domain
	if d.Memory == nil {
		d.Memory = &virtv1.Memory{}
	}
	d.Memory.Guest = &mem
	noHotplug(d)
	if d.Resources.Requests == nil {
		d.Resources.Requests = corev1.ResourceList{}
	}
	if d.Resources.Limits == nil {
		d.Resources.Limits = corev1.ResourceList{}
	}
	d.Resources.Requests[corev1.ResourceMemory] = mem
	d.Resources.Limits[corev1.ResourceMemory] = mem
	d.Resources.Requests[corev1.ResourceCPU] = cpus
	d.Resources.Limits[corev1.ResourceCPU] = cpus
	if opts.DedicatedCPUPlacement {
		if d.CPU == nil {
			d.CPU = &virtv1.CPU{}
		}
		d.CPU.DedicatedCPUPlacement = true
	}
}

// reserve is a member's reservation: the template's resources in full, on a COLO secondary its
// RAM cache too, and on every COLO member the disk writes its QEMU may hold for the secondary.
// Build and LauncherRequests both size a member by it, so that a member is placed at the size it
// is built.
func reserve(spec *virtv1.VirtualMachineInstanceSpec, role string, opts Options) {
	reserveInFull(spec, opts)
	if !opts.COLO.Enabled {
		return
	}
	if role == ftv1.RoleSecondary {
		reserveRAMCache(spec) // sets the request and limit: before what is added to them
	}
	reserveWriteBehind(spec)
}

// LauncherRequests is what the launcher pod of a member built from tmpl in role will request of
// its node in a cluster whose KubeVirt sizes launchers as sizing says (kubevirtsize), reserved as
// Build reserves it.
func LauncherRequests(tmpl ftv1.VMITemplate, role string, opts Options, sizing kubevirtsize.Cluster) (milliCPU, memoryBytes int64, err error) {
	vmi := &virtv1.VirtualMachineInstance{Spec: *tmpl.Spec.DeepCopy()}
	reserve(&vmi.Spec, role, opts)
	return kubevirtsize.LauncherRequests(vmi, sizing)
}

// GuestMemory is the memory the guest sees: memory.guest, else the memory request.
func GuestMemory(spec *virtv1.VirtualMachineInstanceSpec) (resource.Quantity, bool) {
	if m := spec.Domain.Memory; m != nil && m.Guest != nil {
		return m.Guest.DeepCopy(), true
	}
	if q, ok := spec.Domain.Resources.Requests[corev1.ResourceMemory]; ok {
		return q.DeepCopy(), true
	}
	return resource.Quantity{}, false
}

// VCPUs is the guest's vCPU count: sockets*cores*threads when a topology is given, else the CPU
// request rounded up, else 1.
func VCPUs(spec *virtv1.VirtualMachineInstanceSpec) int {
	if c := spec.Domain.CPU; c != nil && (c.Sockets > 0 || c.Cores > 0 || c.Threads > 0) {
		return int(max(c.Sockets, 1) * max(c.Cores, 1) * max(c.Threads, 1))
	}
	if q, ok := spec.Domain.Resources.Requests[corev1.ResourceCPU]; ok {
		return int(max((q.MilliValue()+999)/1000, 1))
	}
	return 1
}

// LoggingNetworkRef is the "namespace/name" of the logging NetworkAttachmentDefinition.
func LoggingNetworkRef(ftvm *ftv1.FaultTolerantVM) string {
	ns, name := LoggingNetworkKey(ftvm)
	return ns + "/" + name
}

// LoggingNetworkKey splits the logging network's name into namespace and name.
func LoggingNetworkKey(ftvm *ftv1.FaultTolerantVM) (string, string) {
	n := ftvm.Spec.LoggingNetwork.Name
	for i := range n {
		if n[i] == '/' {
			return n[:i], n[i+1:]
		}
	}
	return ftvm.Namespace, n
}

// pinAndSeparate pins the member to its node and keeps it away from its partner: every required
// node affinity term of the template also asks for the node by name (terms are ORed, so each
// needs it), and required pod anti-affinity keeps the pair's members on different nodes (and
// topology domains, when the FaultTolerantVM asks). The scheduler then enforces what placement
// decided, even against a stale view.
func pinAndSeparate(a *corev1.Affinity, ftvm *ftv1.FaultTolerantVM, node string) *corev1.Affinity {
	if a == nil {
		a = &corev1.Affinity{}
	}
	pin := corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}
	if a.NodeAffinity == nil {
		a.NodeAffinity = &corev1.NodeAffinity{}
	}
	req := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	if req == nil || len(req.NodeSelectorTerms) == 0 {
		req = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{}}}
	}
	for i := range req.NodeSelectorTerms {
		req.NodeSelectorTerms[i].MatchFields = append(req.NodeSelectorTerms[i].MatchFields, pin)
	}
	a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = req

	if a.PodAntiAffinity == nil {
		a.PodAntiAffinity = &corev1.PodAntiAffinity{}
	}
	keys := []string{HostnameTopologyKey}
	if ftvm.Spec.TopologyKey != "" && ftvm.Spec.TopologyKey != HostnameTopologyKey {
		keys = append(keys, ftvm.Spec.TopologyKey)
	}
	for _, key := range keys {
		a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution = append(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution,
			corev1.PodAffinityTerm{
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{ftv1.LabelPair: ftvm.Name}},
				TopologyKey:   key,
			})
	}
	return a
}

// ClaimOf is the claim that backs a volume: a persistentVolumeClaim's, or a dataVolume's (CDI
// names the claim as the DataVolume); "" for any other volume.
func ClaimOf(v *virtv1.Volume) string {
	switch {
	case v.PersistentVolumeClaim != nil:
		return v.PersistentVolumeClaim.ClaimName
	case v.DataVolume != nil:
		return v.DataVolume.Name
	}
	return ""
}

// UseClaim makes a claim-backed volume use claim. A dataVolume volume stays one while it names its
// own claim (KubeVirt then waits for the DataVolume to be ready); a member's copy is a plain claim.
func UseClaim(v *virtv1.Volume, claim string) {
	switch {
	case v.PersistentVolumeClaim != nil:
		v.PersistentVolumeClaim.ClaimName = claim
	case v.DataVolume != nil && v.DataVolume.Name != claim:
		v.VolumeSource = virtv1.VolumeSource{PersistentVolumeClaim: &virtv1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}
	}
}
