package member

import (
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

func testFTVM() *ftv1.FaultTolerantVM {
	return &ftv1.FaultTolerantVM{
		ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "prod", UID: "6f1c5c8e-0000-4000-8000-000000000001"},
		Spec: ftv1.FaultTolerantVMSpec{
			LoggingNetwork: ftv1.LoggingNetwork{Name: "ft-logging"},
			TopologyKey:    corev1.LabelTopologyZone,
			Template: ftv1.VMITemplate{Spec: virtv1.VirtualMachineInstanceSpec{
				Domain: virtv1.DomainSpec{
					CPU: &virtv1.CPU{Sockets: 2, Cores: 2},
					Resources: virtv1.ResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi"), corev1.ResourceCPU: resource.MustParse("1")},
					},
					Devices: virtv1.Devices{Interfaces: []virtv1.Interface{{Name: "default"}, {Name: "data", MacAddress: "02:00:00:00:00:07"}}},
				},
				Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
					NodeSelectorTerms: []corev1.NodeSelectorTerm{
						{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "ssd", Operator: corev1.NodeSelectorOpExists}}},
						{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "nvme", Operator: corev1.NodeSelectorOpExists}}},
					}}}},
				Volumes: []virtv1.Volume{{Name: "root", VolumeSource: virtv1.VolumeSource{PersistentVolumeClaim: &virtv1.PersistentVolumeClaimVolumeSource{
					PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "db-root"}}}}},
			}},
		},
	}
}

func TestBuildReservesInFullAndPins(t *testing.T) {
	ftvm := testFTVM()
	tmpl := Normalize(ftvm.UID, ftvm.Spec.Template)
	vmi, err := Build(ftvm, tmpl, Member{Ordinal: 3, Role: ftv1.RoleSecondary, Node: "n7", Claims: map[string]string{"root": "db-3-root"},
		Since: time.Unix(0, 0), LogBandwidthMbps: 120}, Options{PriorityClassName: "ft", DedicatedCPUPlacement: true})
	if err != nil {
		t.Fatal(err)
	}
	if vmi.Name != "db-3" || vmi.Namespace != "prod" {
		t.Errorf("name %s/%s", vmi.Namespace, vmi.Name)
	}
	d := vmi.Spec.Domain
	if d.Memory.Guest.String() != "2Gi" || d.Resources.Requests.Memory().String() != "2Gi" || d.Resources.Limits.Memory().String() != "2Gi" {
		t.Errorf("memory not reserved in full: guest %v, resources %+v", d.Memory.Guest, d.Resources)
	}
	// 2 sockets x 2 cores: the CPU request of 1 is raised to the 4 vCPUs.
	if d.Resources.Requests.Cpu().String() != "4" || d.Resources.Limits.Cpu().String() != "4" {
		t.Errorf("cpu not reserved in full: %+v", d.Resources)
	}
	if !d.CPU.DedicatedCPUPlacement {
		t.Error("dedicated CPU placement not set")
	}
	// No room to hot-plug into: KubeVirt's defaults would add four times the memory and sockets.
	if d.Memory.MaxGuest == nil || d.Memory.MaxGuest.Cmp(*d.Memory.Guest) != 0 || d.CPU.MaxSockets != 2 {
		t.Errorf("hotplug room: maxGuest %v (guest %v), maxSockets %d (sockets 2)", d.Memory.MaxGuest, d.Memory.Guest, d.CPU.MaxSockets)
	}
	if *vmi.Spec.EvictionStrategy != virtv1.EvictionStrategyExternal || vmi.Spec.PriorityClassName != "ft" {
		t.Errorf("eviction %v, priority class %q", *vmi.Spec.EvictionStrategy, vmi.Spec.PriorityClassName)
	}
	// The pin is added to every required term, since terms are ORed.
	terms := vmi.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 2 {
		t.Fatalf("terms: %+v", terms)
	}
	for _, term := range terms {
		if len(term.MatchExpressions) != 1 || len(term.MatchFields) != 1 || term.MatchFields[0].Values[0] != "n7" {
			t.Errorf("term not pinned: %+v", term)
		}
	}
	anti := vmi.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	if len(anti) != 2 || anti[0].TopologyKey != corev1.LabelHostname || anti[1].TopologyKey != corev1.LabelTopologyZone {
		t.Errorf("anti-affinity: %+v", anti)
	}
	if vmi.Spec.Volumes[0].PersistentVolumeClaim.ClaimName != "db-3-root" {
		t.Errorf("claim not the member's copy: %s", vmi.Spec.Volumes[0].PersistentVolumeClaim.ClaimName)
	}
	for _, n := range vmi.Spec.Networks {
		if n.Multus != nil && n.Multus.NetworkName == LoggingNetworkRef(ftvm) {
			t.Errorf("the guest has a NIC on the logging network, which carries lockstepd's streams: %+v", n)
		}
	}
	for k, v := range map[string]string{ftv1.LabelPair: "db", ftv1.LabelRole: "secondary", ftv1.LabelNode: "n7"} {
		if vmi.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, vmi.Labels[k], v)
		}
	}
	if vmi.Annotations[ftv1.AnnotationReservedLogBandwidth] != "120" || vmi.Annotations[ftv1.AnnotationOrdinal] != "3" {
		t.Errorf("annotations: %v", vmi.Annotations)
	}
	// The template it was built from comes back out unchanged.
	back, err := DecodeTemplate(vmi)
	if err != nil {
		t.Fatal(err)
	}
	if _, h1, _ := EncodeTemplate(back); h1 != vmi.Annotations[ftv1.AnnotationTemplateHash] {
		t.Error("template does not round-trip")
	}
	// Building does not change the template it was given.
	if tmpl.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchFields != nil {
		t.Error("Build changed its input")
	}
}

func TestNormalizeGivesBothMembersTheSameHardware(t *testing.T) {
	ftvm := testFTVM()
	a := Normalize(ftvm.UID, ftvm.Spec.Template)
	b := Normalize(ftvm.UID, ftvm.Spec.Template)
	if a.Spec.Domain.Firmware.UUID != ftvm.UID {
		t.Errorf("firmware UUID %q", a.Spec.Domain.Firmware.UUID)
	}
	mac := regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)
	for i := range a.Spec.Domain.Devices.Interfaces {
		m := a.Spec.Domain.Devices.Interfaces[i].MacAddress
		if m != b.Spec.Domain.Devices.Interfaces[i].MacAddress || !mac.MatchString(m) {
			t.Errorf("interface %d: %q vs %q", i, m, b.Spec.Domain.Devices.Interfaces[i].MacAddress)
		}
	}
	first := a.Spec.Domain.Devices.Interfaces[0].MacAddress
	if first[1] != '2' && first[1] != '6' && first[1] != 'a' && first[1] != 'e' {
		t.Errorf("MAC %s is not locally administered unicast", first)
	}
	if a.Spec.Domain.Devices.Interfaces[1].MacAddress != "02:00:00:00:00:07" {
		t.Error("a MAC the user chose was changed")
	}
	other := Normalize("another-uid", ftvm.Spec.Template)
	if other.Spec.Domain.Devices.Interfaces[0].MacAddress == first {
		t.Error("two VMs got the same MAC")
	}
	if ftvm.Spec.Template.Spec.Domain.Firmware != nil {
		t.Error("Normalize changed its input")
	}
}

func TestVCPUs(t *testing.T) {
	spec := func(cpu *virtv1.CPU, req string) *virtv1.VirtualMachineInstanceSpec {
		s := &virtv1.VirtualMachineInstanceSpec{Domain: virtv1.DomainSpec{CPU: cpu}}
		if req != "" {
			s.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(req)}
		}
		return s
	}
	for _, c := range []struct {
		spec *virtv1.VirtualMachineInstanceSpec
		want int
	}{
		{spec(nil, ""), 1},
		{spec(nil, "2500m"), 3},
		{spec(&virtv1.CPU{Cores: 4}, "1"), 4},
		{spec(&virtv1.CPU{Sockets: 2, Cores: 2, Threads: 2}, ""), 8},
		{spec(&virtv1.CPU{Model: "host-passthrough"}, "2"), 2},
	} {
		if got := VCPUs(c.spec); got != c.want {
			t.Errorf("VCPUs(%+v) = %d, want %d", c.spec.Domain, got, c.want)
		}
	}
}

// TestBuildTakesNoKeyOfLockstepsOwnFromTheTemplate: a template written before admission refused
// them cannot make a new secondary look synchronized, or name whose replicas its blank copies
// hold; a member says whose replicas it holds only when the operator handed them over.
func TestBuildTakesNoKeyOfLockstepsOwnFromTheTemplate(t *testing.T) {
	ftvm := testFTVM()
	tmpl := Normalize(ftvm.UID, ftvm.Spec.Template)
	tmpl.Metadata.Annotations = map[string]string{ftv1.AnnotationSyncedAt: "2026-11-26T10:00:00Z", ftv1.AnnotationReplicaOf: "db-2", "team": "db"}
	tmpl.Metadata.Labels = map[string]string{ftv1.LabelRole: ftv1.RolePrimary, "app": "db"}
	build := func(m Member) *virtv1.VirtualMachineInstance {
		t.Helper()
		vmi, err := Build(ftvm, tmpl, m, Options{})
		if err != nil {
			t.Fatal(err)
		}
		return vmi
	}
	vmi := build(Member{Ordinal: 3, Role: ftv1.RoleSecondary, Node: "n7", Since: time.Unix(0, 0)})
	if _, ok := vmi.Annotations[ftv1.AnnotationSyncedAt]; ok {
		t.Errorf("synced-at taken from the template")
	}
	if _, ok := vmi.Annotations[ftv1.AnnotationReplicaOf]; ok {
		t.Errorf("replica-of taken from the template")
	}
	if vmi.Labels[ftv1.LabelRole] != ftv1.RoleSecondary || vmi.Labels["app"] != "db" || vmi.Annotations["team"] != "db" {
		t.Errorf("labels %v, annotations %v", vmi.Labels, vmi.Annotations)
	}
	if got := build(Member{Ordinal: 3, Role: ftv1.RoleSecondary, Node: "n7", ReplicaOf: "db-2"}).Annotations[ftv1.AnnotationReplicaOf]; got != "db-2" {
		t.Errorf("a member handed db-2's copies names %q", got)
	}
}

func TestEveryMemberGivesTheGuestTheSameHostname(t *testing.T) {
	ftvm := testFTVM()
	tmpl := Normalize(ftvm.UID, ftvm.Spec.Template)
	var names []string
	for _, m := range []Member{{Role: ftv1.RolePrimary, Ordinal: 1, Node: "a"}, {Role: ftv1.RoleSecondary, Ordinal: 2, Node: "b"}, {Role: ftv1.RolePrimary, Ordinal: 7, Node: "c"}} {
		vmi, err := Build(ftvm, tmpl, m, Options{})
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, vmi.Spec.Hostname)
	}
	if names[0] != ftvm.Name || names[1] != ftvm.Name || names[2] != ftvm.Name {
		t.Errorf("the members' hostnames: %v, want %s for each", names, ftvm.Name)
	}
	tmpl.Spec.Hostname = "mail"
	if vmi, _ := Build(ftvm, tmpl, Member{Role: ftv1.RolePrimary, Ordinal: 1}, Options{}); vmi.Spec.Hostname != "mail" {
		t.Errorf("a hostname the user chose became %q", vmi.Spec.Hostname)
	}
	for name, want := range map[string]string{
		"db.eu-west":                   "db",
		strings.Repeat("a", 62) + "-b": strings.Repeat("a", 62),
		strings.Repeat("x", 70):        strings.Repeat("x", 63),
	} {
		got := Hostname(name)
		if got != want || len(validation.IsDNS1123Label(got)) > 0 {
			t.Errorf("Hostname(%q) = %q, want %q, a DNS label", name, got, want)
		}
	}
}
