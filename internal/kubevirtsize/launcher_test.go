package kubevirtsize_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/kubevirtsize"
	"github.com/lockstep-dev/lockstep/internal/member"
)

// TestLauncherMemoryIsKubeVirts: the compute container's memory, as KubeVirt v1.9 sizes it, for
// the shapes of VMI that lockstep's members and KubeVirt's own tests have.
func TestLauncherMemoryIsKubeVirts(t *testing.T) {
	mi := func(s string) resource.Quantity { return resource.MustParse(s) }
	mib := func(s string) int64 { q := resource.MustParse(s); return q.Value() >> 20 }
	off, on := false, true
	vmi := func(mutate func(*virtv1.VirtualMachineInstanceSpec)) *virtv1.VirtualMachineInstance {
		v := &virtv1.VirtualMachineInstance{}
		mutate(&v.Spec)
		return v
	}
	reserved := func(memory, cpus string) func(*virtv1.VirtualMachineInstanceSpec) {
		return func(s *virtv1.VirtualMachineInstanceSpec) {
			s.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: mi(memory), corev1.ResourceCPU: mi(cpus)}
			s.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: mi(memory), corev1.ResourceCPU: mi(cpus)}
		}
	}
	for _, c := range []struct {
		name             string
		vmi              *virtv1.VirtualMachineInstance
		request, limit   string // "" limit: none
		overhead, reason string
	}{
		// KubeVirt's own test of the overhead: 1Gi requested and nothing else (2Mi of page tables,
		// 220Mi for its processes, 8Mi for one vCPU and 8Mi for the IO thread, 32Mi of video).
		{"a request alone", vmi(func(s *virtv1.VirtualMachineInstanceSpec) {
			s.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: mi("1Gi")}
		}), "1294Mi", "", "270Mi", ""},
		// Members of a guest of 512Mi with 2 vCPUs, as the operator builds them: reserved in full
		// (Guaranteed QoS: 100Mi more); the secondary reserves its RAM cache too, twice the guest
		// (and twice the page tables).
		// Members reserve 16Mi for the writes their QEMU may hold of their one replicated disk.
		{"a primary of 512Mi", builtMember(t, ftv1.RolePrimary), "905Mi", "905Mi", "377Mi", ""},
		{"a secondary of 512Mi", builtMember(t, ftv1.RoleSecondary), "1418Mi", "1418Mi", "378Mi", ""},
		{"guest memory alone", vmi(func(s *virtv1.VirtualMachineInstanceSpec) {
			g := mi("256Mi")
			s.Domain.Memory = &virtv1.Memory{Guest: &g}
			s.Domain.CPU = &virtv1.CPU{Sockets: 2, Cores: 2}
		}), "548Mi", "", "292Mi", ""},
		{"no graphics, both exec probes, a TPM, dedicated CPUs", vmi(func(s *virtv1.VirtualMachineInstanceSpec) {
			reserved("512Mi", "1")(s)
			s.Domain.Resources.Limits = nil // no limit: not Guaranteed, but dedicated CPUs count the same
			s.Domain.CPU = &virtv1.CPU{DedicatedCPUPlacement: true}
			s.Domain.Devices.AutoattachGraphicsDevice = &off
			s.Domain.Devices.TPM = &virtv1.TPMDevice{Enabled: &on}
			exec := &virtv1.Probe{Handler: virtv1.Handler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}
			s.LivenessProbe, s.ReadinessProbe = exec, exec
		}), "1022Mi", "", "510Mi", ""},
		{"overcommitted overhead", vmi(func(s *virtv1.VirtualMachineInstanceSpec) {
			reserved("512Mi", "2")(s)
			s.Domain.Resources.OvercommitGuestOverhead = true
		}), "512Mi", "889Mi", "377Mi", ""},
		{"no memory at all", vmi(func(*virtv1.VirtualMachineInstanceSpec) {}), "", "", "", "sets neither"},
	} {
		t.Run(c.name, func(t *testing.T) {
			request, limit, err := kubevirtsize.LauncherMemory(c.vmi, kubevirtsize.Cluster{})
			if c.reason != "" {
				if err == nil {
					t.Fatalf("got %s/%s, want an error", request.String(), limit.String())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			overhead := kubevirtsize.Overhead(c.vmi, kubevirtsize.Cluster{})
			// Page tables are counted in bytes: compare in whole MiB, as KubeVirt's figures are.
			if got := overhead.Value() >> 20; got != mib(c.overhead) {
				t.Errorf("overhead %dMi, want %s", got, c.overhead)
			}
			if got := request.Value() >> 20; got != mib(c.request) {
				t.Errorf("request %dMi, want %s", got, c.request)
			}
			switch {
			case c.limit == "" && !limit.IsZero():
				t.Errorf("limit %s, want none", limit.String())
			case c.limit != "" && limit.Value()>>20 != mib(c.limit):
				t.Errorf("limit %dMi, want %s", limit.Value()>>20, c.limit)
			}
		})
	}
}

// builtMember is a member of a 512Mi, 2-vCPU guest, built by the operator's member.Build.
func builtMember(t *testing.T, role string) *virtv1.VirtualMachineInstance {
	guest := resource.MustParse("512Mi")
	tmpl := ftv1.VMITemplate{Spec: virtv1.VirtualMachineInstanceSpec{Domain: virtv1.DomainSpec{
		CPU: &virtv1.CPU{Cores: 2}, Memory: &virtv1.Memory{Guest: &guest}},
		Volumes: []virtv1.Volume{{Name: "root", VolumeSource: virtv1.VolumeSource{PersistentVolumeClaim: &virtv1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "root"}}}}}}}
	ftvm := &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: "u"}, Spec: ftv1.FaultTolerantVMSpec{Template: tmpl}}
	vmi, err := member.Build(ftvm, member.Normalize(ftvm.UID, tmpl), member.Member{Role: role, Node: "n",
		DiskSizes: map[string]resource.Quantity{"root": resource.MustParse("1Gi")}, DiskBytes: member.DiskBytes{"root": 1 << 30}}, member.Options{COLO: member.COLO{Enabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	return vmi
}

// TestAMemberIsPlacedAtTheSizeItIsBuilt: placement sizes a member before it is built
// (member.LauncherRequests, from the template); the VMI that member.Build then makes asks for
// exactly that, or a node could be chosen that the member does not fit.
func TestAMemberIsPlacedAtTheSizeItIsBuilt(t *testing.T) {
	for _, role := range []string{ftv1.RolePrimary, ftv1.RoleSecondary} {
		vmi := builtMember(t, role)
		cpu, memory, err := kubevirtsize.LauncherRequests(vmi, kubevirtsize.Cluster{})
		if err != nil {
			t.Fatal(err)
		}
		tmpl, err := member.DecodeTemplate(vmi)
		if err != nil {
			t.Fatal(err)
		}
		wantCPU, wantMemory, err := member.LauncherRequests(tmpl, role, member.Options{COLO: member.COLO{Enabled: true}}, kubevirtsize.Cluster{})
		if err != nil {
			t.Fatal(err)
		}
		if cpu != wantCPU || memory != wantMemory {
			t.Errorf("%s: built at %dm CPU and %d MiB, placed at %dm and %d MiB", role, cpu, memory>>20, wantCPU, wantMemory>>20)
		}
		if cpu != 2000 {
			t.Errorf("%s: %dm CPU, want its 2 vCPUs in full", role, cpu)
		}
		if role == ftv1.RoleSecondary {
			primaryCPU, primaryMemory, _ := kubevirtsize.LauncherRequests(builtMember(t, ftv1.RolePrimary), kubevirtsize.Cluster{})
			if memory-primaryMemory < 512<<20 || cpu != primaryCPU {
				t.Errorf("a COLO secondary holds its RAM cache: %d MiB against its primary's %d MiB", memory>>20, primaryMemory>>20)
			}
		}
	}
}

// TestTheKubeVirtCRChangesTheOverheadAsKubeVirtDoes: what a cluster's KubeVirt CR and
// architecture add to the overhead of a VMI that requests 1Gi (270Mi with none of it), as v1.9's
// CalculateMemoryOverhead computes it: the ratio multiplies the hypervisor's share last (in
// thousands of bytes); passt and the binding plugins come after, each plugin once.
func TestTheKubeVirtCRChangesTheOverheadAsKubeVirtDoes(t *testing.T) {
	ratio := func(r string) *string { return &r }
	plugin := func(memory string) virtv1.InterfaceBindingPlugin {
		return virtv1.InterfaceBindingPlugin{ComputeResourceOverhead: &virtv1.ResourceRequirementsWithoutClaims{
			Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(memory)}}}
	}
	kv := func(r *string, bindings map[string]virtv1.InterfaceBindingPlugin) *virtv1.KubeVirt {
		k := &virtv1.KubeVirt{}
		k.Spec.Configuration.AdditionalGuestMemoryOverheadRatio = r
		if bindings != nil {
			k.Spec.Configuration.NetworkConfiguration = &virtv1.NetworkConfiguration{Binding: bindings}
		}
		return k
	}
	bindings := map[string]virtv1.InterfaceBindingPlugin{"managedtap": plugin("100Mi"), "sidecar": {}}
	for _, c := range []struct {
		name       string
		kv         *virtv1.KubeVirt
		arch       string // the cluster's
		vmiArch    string
		interfaces []virtv1.Interface
		want       int64 // MiB
	}{
		{"no KubeVirt CR", nil, "amd64", "", nil, 270},
		{"a CR that sets nothing", kv(nil, nil), "amd64", "", nil, 270},
		{"ratio 2", kv(ratio("2"), nil), "amd64", "", nil, 540},
		{"ratio 1.5", kv(ratio("1.5"), nil), "amd64", "", nil, 405},
		{"a ratio KubeVirt's webhook would refuse is left out", kv(ratio("lots"), nil), "amd64", "", nil, 270},
		{"passt, after the ratio", kv(ratio("2"), nil), "amd64", "", []virtv1.Interface{{Name: "a", InterfaceBindingMethod: virtv1.InterfaceBindingMethod{PasstBinding: &virtv1.InterfacePasstBinding{}}}}, 790},
		{"a binding plugin counted once, one without an overhead, one not registered", kv(nil, bindings), "amd64", "", []virtv1.Interface{
			{Name: "a", Binding: &virtv1.PluginBinding{Name: "managedtap"}}, {Name: "b", Binding: &virtv1.PluginBinding{Name: "managedtap"}},
			{Name: "c", Binding: &virtv1.PluginBinding{Name: "sidecar"}}, {Name: "d", Binding: &virtv1.PluginBinding{Name: "unknown"}}}, 370},
		{"an arm64 VMI: UEFI's flash", nil, "amd64", "arm64", nil, 398},
		{"on an arm64 cluster, a VMI that names no architecture", nil, "arm64", "", nil, 398},
		{"on an arm64 cluster, an amd64 VMI", nil, "arm64", "amd64", nil, 270},
	} {
		t.Run(c.name, func(t *testing.T) {
			vmi := &virtv1.VirtualMachineInstance{}
			vmi.Spec.Architecture = c.vmiArch
			vmi.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
			vmi.Spec.Domain.Devices.Interfaces = c.interfaces
			o := kubevirtsize.Overhead(vmi, kubevirtsize.ClusterOf(c.kv, c.arch))
			if got := o.Value() >> 20; got != c.want {
				t.Errorf("overhead %dMi (%d bytes), want %dMi", got, o.Value(), c.want)
			}
		})
	}
	if c := kubevirtsize.ClusterOfList(nil, "amd64"); c.OverheadRatio != nil || c.Arch != "amd64" {
		t.Errorf("a cluster without a KubeVirt CR: %+v", c)
	}
	if c := kubevirtsize.ClusterOfList([]virtv1.KubeVirt{*kv(ratio("3"), nil)}, "amd64"); c.OverheadRatio == nil || *c.OverheadRatio != "3" {
		t.Errorf("the cluster's KubeVirt CR: %+v", c)
	}
}

// TestAVMIThatAsksForNoCPUGetsItsShareOfTheAllocationRatio: KubeVirt requests a VMI's vCPUs (and
// supplemental IO threads) over the CPU allocation ratio when the VMI asks for no CPU; a request
// or a limit of its own is taken as it is.
func TestAVMIThatAsksForNoCPUGetsItsShareOfTheAllocationRatio(t *testing.T) {
	two := uint32(2)
	withMemory := func(mutate func(*virtv1.VirtualMachineInstanceSpec)) *virtv1.VirtualMachineInstance {
		v := &virtv1.VirtualMachineInstance{}
		v.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
		mutate(&v.Spec)
		return v
	}
	for _, c := range []struct {
		name  string
		vmi   *virtv1.VirtualMachineInstance
		ratio int
		want  int64
	}{
		{"one vCPU", withMemory(func(*virtv1.VirtualMachineInstanceSpec) {}), 0, 100},
		{"four cores", withMemory(func(s *virtv1.VirtualMachineInstanceSpec) { s.Domain.CPU = &virtv1.CPU{Cores: 4} }), 0, 400},
		{"one vCPU, ratio 3", withMemory(func(*virtv1.VirtualMachineInstanceSpec) {}), 3, 334},
		{"twelve vCPUs", withMemory(func(s *virtv1.VirtualMachineInstanceSpec) { s.Domain.CPU = &virtv1.CPU{Sockets: 2, Cores: 6} }), 0, 1200},
		{"two supplemental IO threads", withMemory(func(s *virtv1.VirtualMachineInstanceSpec) {
			s.Domain.IOThreads = &virtv1.DiskIOThreads{SupplementalPoolThreadCount: &two}
		}), 0, 300},
		{"a request of its own", withMemory(func(s *virtv1.VirtualMachineInstanceSpec) {
			s.Domain.CPU = &virtv1.CPU{Cores: 4}
			s.Domain.Resources.Requests[corev1.ResourceCPU] = resource.MustParse("250m")
		}), 0, 250},
		{"a limit alone", withMemory(func(s *virtv1.VirtualMachineInstanceSpec) {
			s.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
		}), 0, 2000},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, _, err := kubevirtsize.LauncherRequests(c.vmi, kubevirtsize.Cluster{CPUAllocationRatio: c.ratio})
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("%dm CPU, want %dm", got, c.want)
			}
		})
	}
}
