// Command domainxml writes the libvirt domain that KubeVirt's virt-launcher makes of a VMI: KubeVirt
// v1.9.0's own converter (Convert_v1_VirtualMachineInstance_To_api_Domain) and domain defaulter,
// called as virt-launcher's SyncVMI calls them, with the options virt-handler sends for a cluster
// with KubeVirt's default configuration. It builds inside hack/build-kubevirt.sh's module (it
// imports kubevirt.io/kubevirt), never in lockstep's: hence its own go.mod.
//
//	domainxml [flags] < vmi.json > domain.xml
//
// Of what virt-launcher does after the converter, it does the two steps that change the domain's
// XML, with KubeVirt's own functions: each disk's cache and I/O mode (SetDriverCacheMode,
// SetOptimalIOMode) and each tap interface's target and MTU (as virt-launcher's
// TapLibvirtSpecGenerator finds them on the pod's links). With --plugins it then applies the
// cluster's KubeVirt Plugins as virt-launcher does at boot (plugins.ApplyDomainHooks: their CEL
// conditions on the VMI, their sidecars called). It writes no file (the cloud-init ISO, the NVRAM)
// and calls no hook sidecar of the Sidecar feature gate. Node facts are flags: whether /dev/kvm is
// there, the launcher image's OVMF files, whether the disks' file system takes O_DIRECT, the pod
// link's MTU. With --pci-devices it writes how many of the domain's devices KubeVirt counts as
// taking a PCI slot, which sizes the root ports virt-launcher adds for hot-plug.
package main

import (
	"encoding/json"
	"encoding/xml"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"

	v1 "kubevirt.io/api/core/v1"
	pluginv1alpha1 "kubevirt.io/api/plugin/v1alpha1"

	cmdv1 "kubevirt.io/kubevirt/pkg/handler-launcher-com/cmd/v1"
	"kubevirt.io/kubevirt/pkg/network/domainspec"
	"kubevirt.io/kubevirt/pkg/network/link"
	"kubevirt.io/kubevirt/pkg/network/namescheme"
	"kubevirt.io/kubevirt/pkg/network/vmispec"
	virtconfig "kubevirt.io/kubevirt/pkg/virt-config"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter/arch"
	convertertypes "kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter/types"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/plugins"
)

func main() {
	kvm := flag.Bool("kvm", true, "the node has /dev/kvm (the domain's type is kvm; without it, qemu under useEmulation)")
	efiCode := flag.String("efi-code", "/usr/share/edk2/ovmf/OVMF_CODE.secboot.fd", "the launcher image's OVMF code for an EFI guest without secure boot (KubeVirt prefers the secboot build where it exists)")
	efiVars := flag.String("efi-vars", "/usr/share/edk2/ovmf/OVMF_VARS.fd", "the launcher image's OVMF variables template for an EFI guest without secure boot")
	directIO := flag.Bool("direct-io", true, "the disks' file system takes O_DIRECT (then their cache mode is none)")
	mtu := flag.Int("pod-mtu", 1500, "the MTU of the pod's links behind the VM's tap interfaces")
	pciDevices := flag.Bool("pci-devices", false, "write, instead of the domain, how many of its devices KubeVirt counts as taking a PCI slot (converter.CountPCIDevices, which virt-launcher's hot-plug port allocation counts on this domain)")
	pluginsFile := flag.String("plugins", "", "a JSON list of KubeVirt Plugins: their domain hooks are applied as virt-launcher applies them at boot (conditions evaluated, sidecars called)")
	flag.Parse()
	node := nodeFacts{kvm: *kvm, efiCode: *efiCode, efiVars: *efiVars, directIO: *directIO, mtu: *mtu, pciDevices: *pciDevices}
	if *pluginsFile != "" {
		data, err := os.ReadFile(*pluginsFile)
		if err == nil {
			err = json.Unmarshal(data, &node.plugins)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "domainxml: the plugins:", err)
			os.Exit(2)
		}
	}
	if err := run(os.Stdin, os.Stdout, node); err != nil {
		fmt.Fprintln(os.Stderr, "domainxml:", err)
		os.Exit(1)
	}
}

// nodeFacts is what virt-launcher finds on its node and in its pod.
type nodeFacts struct {
	kvm              bool
	efiCode, efiVars string
	directIO         bool
	mtu              int
	// plugins are the cluster's KubeVirt Plugins.
	plugins []pluginv1alpha1.Plugin
	// pciDevices: write the domain's count of PCI devices, not the domain.
	pciDevices bool
}

func run(in io.Reader, out io.Writer, node nodeFacts) error {
	vmi := &v1.VirtualMachineInstance{}
	if err := json.NewDecoder(in).Decode(vmi); err != nil {
		return fmt.Errorf("reading the VMI: %w", err)
	}
	c := &convertertypes.ConverterContext{
		Architecture:              arch.NewConverter(vmi.Spec.Architecture),
		VirtualMachine:            vmi,
		AllowEmulation:            true,
		HostArchitecture:          runtime.GOARCH,
		HypervisorDeviceAvailable: node.kvm,
		IsBlockPVC:                map[string]bool{},
		IsBlockDV:                 map[string]bool{},
		PermanentVolumes:          map[string]v1.VolumeStatus{},
		HotplugVolumes:            map[string]v1.VolumeStatus{},
		UseVirtioTransitional:     vmi.Spec.Domain.Devices.UseVirtioTransitional != nil && *vmi.Spec.Domain.Devices.UseVirtioTransitional,
		// virt-handler's options for KubeVirt's default configuration.
		SMBios: &cmdv1.SMBios{Family: virtconfig.SmbiosConfigDefaultFamily, Manufacturer: virtconfig.SmbiosConfigDefaultManufacturer,
			Product: virtconfig.SmbiosConfigDefaultProduct},
		MemBalloonStatsPeriod:           uint(virtconfig.DefaultMemBalloonStatsPeriod),
		FreePageReporting:               freePageReporting(vmi),
		SerialConsoleLog:                vmi.Spec.Domain.Devices.LogSerialConsole == nil || *vmi.Spec.Domain.Devices.LogSerialConsole,
		BochsForEFIGuests:               true,
		DomainAttachmentByInterfaceName: domainspec.DomainAttachmentByInterfaceName(vmi.Spec.Domain.Devices.Interfaces, nil),
	}
	if vmi.IsBootloaderEFI() {
		if sb := vmi.Spec.Domain.Firmware.Bootloader.EFI.SecureBoot; sb == nil || *sb {
			return fmt.Errorf("an EFI guest with secure boot: only efi.secureBoot false is written")
		}
		c.EFIConfiguration = &convertertypes.EFIConfiguration{EFICode: node.efiCode, EFIVars: node.efiVars}
	}
	domain := &api.Domain{}
	if err := converter.Convert_v1_VirtualMachineInstance_To_api_Domain(vmi, domain, c); err != nil {
		return fmt.Errorf("KubeVirt's converter: %w", err)
	}
	api.NewDefaulter(c.Architecture.GetArchitecture()).SetObjectDefaults_Domain(domain)
	// virt-launcher's pre-start hook: the disks' cache and I/O modes.
	for i := range domain.Spec.Devices.Disks {
		if err := converter.SetDriverCacheMode(&domain.Spec.Devices.Disks[i], directIO(node.directIO)); err != nil {
			return err
		}
		converter.SetOptimalIOMode(&domain.Spec.Devices.Disks[i], func(string) bool { return false })
	}
	// virt-launcher's network setup: each tap interface's target and MTU.
	if err := tapTargets(vmi, domain, node.mtu); err != nil {
		return err
	}
	// The Plugins' domain hooks, as virt-launcher calls them before it defines the domain.
	spec, _, err := plugins.ApplyDomainHooks(node.plugins, vmi, &domain.Spec, pluginv1alpha1.InvocationContextBoot)
	if err != nil {
		return fmt.Errorf("KubeVirt's Plugins: %w", err)
	}
	domain.Spec = *spec
	if node.pciDevices {
		n, err := converter.CountPCIDevices(&domain.Spec)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(out, n)
		return err
	}
	data, err := xml.MarshalIndent(domain.Spec, "", "\t")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, string(data))
	return err
}

// freePageReporting is virt-launcher's isFreePageReportingEnabled with the cluster's default (on).
func freePageReporting(vmi *v1.VirtualMachineInstance) bool {
	return !(vmi.Spec.Domain.Devices.AutoattachMemBalloon != nil && !*vmi.Spec.Domain.Devices.AutoattachMemBalloon) &&
		!vmi.IsHighPerformanceVMI() && vmi.GetAnnotations()[v1.FreePageReportingDisabledAnnotation] != "true"
}

// directIO is a DirectIOChecker that answers for every path what the node's file system does.
type directIO bool

func (d directIO) CheckBlockDevice(string) (bool, error) { return bool(d), nil }
func (d directIO) CheckFile(string) (bool, error)        { return bool(d), nil }

// tapTargets gives each interface that KubeVirt attaches by tap the target and MTU that
// virt-launcher's TapLibvirtSpecGenerator finds: the tap virt-handler made for the pod's link
// (KubeVirt's names: eth0 for the primary network, the hashed name for a secondary Multus one),
// unmanaged, at the link's MTU.
func tapTargets(vmi *v1.VirtualMachineInstance, domain *api.Domain, mtu int) error {
	networks := map[string]v1.Network{}
	for _, n := range vmi.Spec.Networks {
		networks[n.Name] = n
	}
	attachments := domainspec.DomainAttachmentByInterfaceName(vmi.Spec.Domain.Devices.Interfaces, nil)
	for i := range domain.Spec.Devices.Interfaces {
		di := &domain.Spec.Devices.Interfaces[i]
		if di.Alias == nil {
			continue
		}
		name := di.Alias.GetName()
		if attachments[name] != string(v1.Tap) {
			continue
		}
		n, ok := networks[name]
		if !ok {
			return fmt.Errorf("interface %s has no network", name)
		}
		podIface := "eth0"
		if vmispec.IsSecondaryMultusNetwork(n) {
			podIface = namescheme.GenerateHashedInterfaceName(n.Name)
		}
		di.Target = &api.InterfaceTarget{Device: link.GenerateTapDeviceName(podIface, n), Managed: "no"}
		di.MTU = &api.MTU{Size: strconv.Itoa(mtu)}
	}
	return nil
}
