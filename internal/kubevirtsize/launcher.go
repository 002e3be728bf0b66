// Package kubevirtsize is how KubeVirt v1.9's virt-controller sizes a VMI's launcher pod: the
// compute container, where virt-launcher, its libvirt daemons and QEMU run, gets the VMI's CPU
// request, and its memory request and limit each plus KubeVirt's estimate of the VMI's overhead
// (CalculateMemoryOverhead: the KVM backend's GetMemoryOverhead, times the KubeVirt CR's
// additional overhead ratio, plus what the VMI's network bindings take). The scheduler places the
// pod by the requests; the kernel kills what the container holds beyond the limit. The operator
// counts a member it is about to place by it, and the KubeVirt test double sizes its launcher
// pods by it. It is pure: no Kubernetes clients, no I/O.
package kubevirtsize

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	virtv1 "kubevirt.io/api/core/v1"
)

// Cluster is what of the cluster's KubeVirt configuration (its KubeVirt CR, and virt-controller's
// architecture) sizes a launcher. The zero value is a KubeVirt CR that sets none of it, on amd64.
type Cluster struct {
	// OverheadRatio multiplies the hypervisor's share of the overhead
	// (spec.configuration.additionalGuestMemoryOverheadRatio, a decimal such as "1.5").
	OverheadRatio *string
	// Bindings are the network binding plugins (spec.configuration.network.binding): each one a
	// VMI's interfaces use adds its computeResourceOverhead's memory request, once.
	Bindings map[string]virtv1.InterfaceBindingPlugin
	// Arch is the architecture of a VMI that names none (virt-controller's own): arm64 adds the
	// 128 MiB of its UEFI flash.
	Arch string
	// CPUAllocationRatio divides the vCPUs of a VMI that asks for no CPU into the CPU its launcher
	// requests (spec.configuration.developerConfiguration.cpuAllocationRatio; 0: KubeVirt's 10).
	CPUAllocationRatio int
}

// defaultCPUAllocationRatio is KubeVirt's when its CR sets none.
const defaultCPUAllocationRatio = 10

// ClusterOfList is the sizing configuration of a cluster whose KubeVirt CRs are kvs (virt-operator
// runs one, and refuses a second) and whose virt-controller runs on arch.
func ClusterOfList(kvs []virtv1.KubeVirt, arch string) Cluster {
	if len(kvs) == 0 {
		return ClusterOf(nil, arch)
	}
	return ClusterOf(&kvs[0], arch)
}

// ClusterOf is the sizing configuration of kv, a cluster's KubeVirt CR (nil: none), whose
// virt-controller runs on arch.
func ClusterOf(kv *virtv1.KubeVirt, arch string) Cluster {
	c := Cluster{Arch: arch}
	if kv == nil {
		return c
	}
	c.OverheadRatio = kv.Spec.Configuration.AdditionalGuestMemoryOverheadRatio
	if n := kv.Spec.Configuration.NetworkConfiguration; n != nil {
		c.Bindings = n.Binding
	}
	if d := kv.Spec.Configuration.DeveloperConfiguration; d != nil {
		c.CPUAllocationRatio = d.CPUAllocationRatio
	}
	return c
}

// Overhead is what KubeVirt v1.9 adds to a VMI's memory for its launcher. The hypervisor's share:
// page tables (a bit per 512 bytes of the memory request), virt-launcher's monitor and itself,
// virtlogd, virtqemud and QEMU (the `ps` RSS KubeVirt measured of each: 25, 100, 25, 40 and
// 30 MiB), 8 MiB per vCPU and 8 MiB for the IO thread, 32 MiB of video RAM unless graphics are
// off, 128 MiB of UEFI flash on arm64, and the extras of devices, probes and pinning, all times
// c's ratio (KubeVirt multiplies last, in thousands of bytes). Then the network's share: 250 MiB
// for passt (the core passtBinding), and each binding plugin's memory request once.
func Overhead(vmi *virtv1.VirtualMachineInstance, c Cluster) resource.Quantity {
	bytes := hypervisorOverhead(vmi, c.Arch)
	if c.OverheadRatio != nil && *c.OverheadRatio != "" {
		// An invalid ratio is left out, as KubeVirt leaves it out (its webhook refuses one).
		if r, err := strconv.ParseFloat(*c.OverheadRatio, 64); err == nil {
			kilo := (bytes + 999) / 1000 // KubeVirt's ScaledValue(Kilo) rounds up
			bytes += int64(float64(kilo)*(r-1)) * 1000
		}
	}
	bytes += networkOverhead(vmi, c.Bindings)
	return *resource.NewQuantity(bytes, resource.BinarySI)
}

// networkOverhead is what the VMI's interfaces' bindings add to its launcher.
func networkOverhead(vmi *virtv1.VirtualMachineInstance, bindings map[string]virtv1.InterfaceBindingPlugin) int64 {
	var bytes int64
	counted := map[string]bool{}
	passt := false
	for _, i := range vmi.Spec.Domain.Devices.Interfaces {
		if i.PasstBinding != nil {
			passt = true
		}
		if i.Binding == nil || counted[i.Binding.Name] {
			continue
		}
		p, ok := bindings[i.Binding.Name]
		if !ok {
			continue
		}
		counted[i.Binding.Name] = true
		if p.ComputeResourceOverhead != nil {
			if q, ok := p.ComputeResourceOverhead.Requests[corev1.ResourceMemory]; ok {
				bytes += q.Value()
			}
		}
	}
	if passt {
		bytes += 250 << 20 // passt's, with every port forwarded
	}
	return bytes
}

// hypervisorOverhead is the KVM backend's share of Overhead, in bytes, before the ratio.
func hypervisorOverhead(vmi *virtv1.VirtualMachineInstance, clusterArch string) int64 {
	d := vmi.Spec.Domain
	mi := func(n int64) int64 { return n << 20 }
	// The memory request in thousands of bytes (rounded up), over 512, as KubeVirt computes it.
	request := d.Resources.Requests.Memory().ScaledValue(resource.Kilo)
	bytes := request * 1000 / 512
	bytes += mi(25 + 100 + 25 + 40 + 30)
	bytes += mi(8) * vcpus(vmi)
	bytes += mi(8)
	if d.Devices.AutoattachGraphicsDevice == nil || *d.Devices.AutoattachGraphicsDevice {
		bytes += mi(32)
	}
	if arch := vmi.Spec.Architecture; arch == "arm64" || arch == "" && clusterArch == "arm64" {
		bytes += mi(128)
	}
	if len(d.Devices.HostDevices) > 0 || len(d.Devices.GPUs) > 0 || hasSRIOV(vmi) { // VFIO locks the guest's RAM and MMIO space
		bytes += mi(1024)
	}
	for _, v := range vmi.Spec.Volumes {
		if v.DownwardMetrics != nil {
			bytes += mi(1)
			break
		}
	}
	bytes += probeOverhead(vmi)
	if ls := d.LaunchSecurity; ls != nil && (ls.SEV != nil || ls.SNP != nil) {
		bytes += mi(256)
	}
	if tpm := d.Devices.TPM; tpm != nil && (tpm.Enabled == nil || *tpm.Enabled) { // swtpm
		bytes += mi(53)
	}
	if (d.CPU != nil && d.CPU.DedicatedCPUPlacement) || qosGuaranteed(vmi) {
		bytes += mi(100)
	}
	if m := d.Memory; m != nil && m.ReservedOverhead != nil && m.ReservedOverhead.AddedOverhead != nil {
		bytes += m.ReservedOverhead.AddedOverhead.Value()
	}
	return bytes
}

// LauncherMemory is the compute container's memory request and limit (zero: no limit) for vmi in
// cluster c: the VMI's request (else its limit, else its guest memory) and its limit, each plus
// Overhead (the request without it where the VMI overcommits its overhead).
func LauncherMemory(vmi *virtv1.VirtualMachineInstance, c Cluster) (request, limit resource.Quantity, err error) {
	res := vmi.Spec.Domain.Resources
	request, hasRequest := res.Requests[corev1.ResourceMemory]
	limit, hasLimit := res.Limits[corev1.ResourceMemory]
	switch {
	case hasRequest && !request.IsZero():
		request = request.DeepCopy()
	case hasLimit && !limit.IsZero():
		request = limit.DeepCopy()
	case vmi.Spec.Domain.Memory != nil && vmi.Spec.Domain.Memory.Guest != nil:
		request = vmi.Spec.Domain.Memory.Guest.DeepCopy()
	default:
		return request, limit, fmt.Errorf("VMI %s sets neither a memory request nor guest memory", vmi.Name)
	}
	overhead := Overhead(vmi, c)
	if !res.OvercommitGuestOverhead {
		request.Add(overhead)
	}
	if hasLimit {
		limit = limit.DeepCopy()
		limit.Add(overhead)
	} else {
		limit = resource.Quantity{}
	}
	return request, limit, nil
}

// LauncherRequests is what the launcher pod of vmi requests of its node in cluster c: the compute
// container's CPU request (the VMI's, else its limit, else its vCPUs and supplemental IO threads
// over c's CPU allocation ratio) and memory request (LauncherMemory), in millicores and bytes.
// KubeVirt's sidecars (a hook's, for one) are not counted: their size is KubeVirt's
// configuration, not the VMI's.
func LauncherRequests(vmi *virtv1.VirtualMachineInstance, c Cluster) (milliCPU, memoryBytes int64, err error) {
	memory, _, err := LauncherMemory(vmi, c)
	if err != nil {
		return 0, 0, err
	}
	res := vmi.Spec.Domain.Resources
	cpu, ok := res.Requests[corev1.ResourceCPU]
	if !ok {
		cpu, ok = res.Limits[corev1.ResourceCPU]
	}
	if !ok {
		return allocatedMilliCPU(vmi, c), memory.Value(), nil
	}
	return cpu.MilliValue(), memory.Value(), nil
}

// allocatedMilliCPU is the CPU KubeVirt requests for a VMI that asks for none: its vCPUs and
// supplemental IO threads over the CPU allocation ratio (1 vCPU: 100m), rounded up to a millicore.
func allocatedMilliCPU(vmi *virtv1.VirtualMachineInstance, c Cluster) int64 {
	ratio := int64(c.CPUAllocationRatio)
	if ratio <= 0 {
		ratio = defaultCPUAllocationRatio
	}
	cpus := vcpus(vmi)
	if t := vmi.Spec.Domain.IOThreads; t != nil && t.SupplementalPoolThreadCount != nil {
		cpus += int64(*t.SupplementalPoolThreadCount)
	}
	return (cpus*1000 + ratio - 1) / ratio
}

// vcpus is the VMI's vCPUs as KubeVirt counts them once its webhook has set the topology: sockets
// times cores times threads, else the CPU limit, else the CPU request, else 1.
func vcpus(vmi *virtv1.VirtualMachineInstance) int64 {
	if c := vmi.Spec.Domain.CPU; c != nil && (c.Sockets > 0 || c.Cores > 0 || c.Threads > 0) {
		return int64(max(c.Sockets, 1) * max(c.Cores, 1) * max(c.Threads, 1))
	}
	res := vmi.Spec.Domain.Resources
	if q, ok := res.Limits[corev1.ResourceCPU]; ok && q.Value() > 0 {
		return q.Value()
	}
	if q, ok := res.Requests[corev1.ResourceCPU]; ok && q.Value() > 0 {
		return q.Value()
	}
	return 1
}

// qosGuaranteed is KubeVirt's test for a VMI that asks for Guaranteed QoS: memory request equal to
// its limit (or a limit alone) and CPU request equal to its limit.
func qosGuaranteed(vmi *virtv1.VirtualMachineInstance) bool {
	res := vmi.Spec.Domain.Resources
	memory := (res.Requests.Memory().IsZero() && !res.Limits.Memory().IsZero()) ||
		(!res.Requests.Memory().IsZero() && res.Requests.Memory().Cmp(*res.Limits.Memory()) == 0)
	cpu := !res.Requests.Cpu().IsZero() && res.Requests.Cpu().Cmp(*res.Limits.Cpu()) == 0
	return memory && cpu
}

// probeOverhead is KubeVirt's allowance for exec probes (virt-probe): 10 MiB per probe, and
// 100 MiB once.
func probeOverhead(vmi *virtv1.VirtualMachineInstance) int64 {
	var n int64
	for _, p := range []*virtv1.Probe{vmi.Spec.LivenessProbe, vmi.Spec.ReadinessProbe} {
		if p != nil && p.Exec != nil {
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return (n*10 + 100) << 20
}

func hasSRIOV(vmi *virtv1.VirtualMachineInstance) bool {
	for _, i := range vmi.Spec.Domain.Devices.Interfaces {
		if i.SRIOV != nil {
			return true
		}
	}
	return false
}
