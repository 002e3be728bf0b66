package virtlauncher

import (
	"fmt"
	"strings"

	"libvirt.org/go/libvirtxml"
)

// This file is KubeVirt v1.9's define sequence, as virt-launcher runs it for a new domain
// (manager.go's allocateHotplugPorts, network's WithNetworkIfacesResources and
// util.SetDomainSpecStrWithHooks). On a machine that supports PCIe hot-plug (q35):
//  1. with placeholder NICs to reserve, the hook is called on the domain with them, libvirt
//     defines the result, virt-launcher reads it back and calls the hook again on a domain whose
//     <devices> are libvirt's (with its own NICs put back in place of the read-back's) and whose
//     every other element is its original; without placeholders, the hook is called once on the
//     domain;
//  2. where it wants more free root ports than the placeholders reserve, it appends
//     pcie-root-port controllers to the last call's output (each call's output replaces the
//     domain virt-launcher holds) and calls the hook on that a last time.
//
// Each call's output is defined. On other machines (pc) the hook is called once.

// hotplugNICs is how many NICs KubeVirt reserves PCIe ports for, placeholders included
// (calculateHotplugPortCountV1, without the pci-interface-slot-count annotation).
const hotplugNICs = 4

// KubeVirt's wish for free root ports (calculateHotplugPortCountV2): a total of free and used
// ports, and a minimum of free ones; more of both for a guest of over largeGuest bytes.
const (
	hotplugTotalPorts, hotplugMinFreePorts            = 8, 3
	largeGuest                                        = 2 << 30
	largeGuestTotalPorts, largeGuestMinFreePorts      = 16, 6
	maxPCIBusIndex                               uint = 31 // a root port takes a slot of bus 0, which has 32
)

// pcieHotplug says whether KubeVirt reserves hot-plug ports for d (SupportsPCIeHotplug: an amd64
// or arm64 guest on q35 or virt).
func pcieHotplug(d *libvirtxml.Domain) bool {
	if d.OS == nil || d.OS.Type == nil {
		return false
	}
	switch d.OS.Type.Arch {
	case "x86_64", "aarch64", "":
	default:
		return false
	}
	return strings.Contains(d.OS.Type.Machine, "q35") || strings.HasPrefix(d.OS.Type.Machine, "virt")
}

// Placeholders is how many placeholder NICs KubeVirt adds to the first call on d.
func Placeholders(d *libvirtxml.Domain) int {
	if !pcieHotplug(d) || d.Devices == nil || len(d.Devices.Interfaces) == 0 {
		return 0
	}
	return max(0, hotplugNICs-len(d.Devices.Interfaces))
}

// ExtraRootPorts is how many pcie-root-port controllers KubeVirt adds to d for hot-plug beyond
// its placeholder NICs (calculateExtraControllerCount, on the converter's domain).
func ExtraRootPorts(d *libvirtxml.Domain) int {
	if !pcieHotplug(d) {
		return 0
	}
	total, minFree := hotplugTotalPorts, hotplugMinFreePorts
	if memoryBytes(d) > largeGuest {
		total, minFree = largeGuestTotalPorts, largeGuestMinFreePorts
	}
	return max(0, max(total-PCIDevices(d), minFree)-Placeholders(d))
}

// PCIDevices is how many of d's devices KubeVirt counts as taking a PCI slot (converter's
// CountPCIDevices): its NICs, PCI host devices, controllers other than the PCI roots and expander
// buses, virtio disks and inputs, watchdogs, RNGs and the balloon, each where it has no address or
// a PCI one.
func PCIDevices(d *libvirtxml.Domain) int {
	if d.Devices == nil {
		return 0
	}
	dev := d.Devices
	n := 0
	count := func(a *libvirtxml.DomainAddress) {
		if a == nil || a.PCI != nil || *a == (libvirtxml.DomainAddress{}) {
			n++
		}
	}
	for _, i := range dev.Interfaces {
		count(i.Address)
	}
	for _, h := range dev.Hostdevs {
		if h.SubsysPCI != nil {
			count(h.Address)
		}
	}
	for _, c := range dev.Controllers {
		switch c.Model {
		case "pci-root", "pcie-root", "pcie-expander-bus":
		default:
			count(c.Address)
		}
	}
	for _, k := range dev.Disks {
		if k.Target != nil && k.Target.Bus == "virtio" {
			count(k.Address)
		}
	}
	for _, i := range dev.Inputs {
		if i.Bus == "virtio" {
			count(i.Address)
		}
	}
	for _, w := range dev.Watchdogs {
		count(w.Address)
	}
	for _, r := range dev.RNGs {
		count(r.Address)
	}
	if dev.MemBalloon != nil {
		count(dev.MemBalloon.Address)
	}
	return n
}

// memoryBytes is d's <memory> in bytes.
func memoryBytes(d *libvirtxml.Domain) uint64 {
	if d.Memory == nil {
		return 0
	}
	scale := map[string]uint64{"": 1 << 10, "b": 1, "bytes": 1, "KB": 1000, "k": 1 << 10, "KiB": 1 << 10,
		"MB": 1000 * 1000, "M": 1 << 20, "MiB": 1 << 20, "GB": 1000 * 1000 * 1000, "G": 1 << 30, "GiB": 1 << 30}[d.Memory.Unit]
	return uint64(d.Memory.Value) * scale
}

// WithPlaceholders is d with n placeholder NICs after its own, as KubeVirt makes them
// (newInterfacePlaceholder): an ethernet interface on tap placeholder-<i>, not managed by libvirt,
// of the domain's virtio model, with alias placeholder-<i> and nothing else.
func WithPlaceholders(d *libvirtxml.Domain, n int) *libvirtxml.Domain {
	out := copyDomain(d)
	model := "virtio-non-transitional"
	if len(d.Devices.Interfaces) > 0 && d.Devices.Interfaces[0].Model != nil && strings.HasPrefix(d.Devices.Interfaces[0].Model.Type, "virtio") {
		model = d.Devices.Interfaces[0].Model.Type
	}
	for i := range n {
		name := fmt.Sprintf("placeholder-%d", i)
		out.Devices.Interfaces = append(out.Devices.Interfaces, libvirtxml.DomainInterface{
			Source: &libvirtxml.DomainInterfaceSource{Ethernet: &libvirtxml.DomainInterfaceSourceEthernet{}},
			Target: &libvirtxml.DomainInterfaceTarget{Dev: name, Managed: "no"},
			Model:  &libvirtxml.DomainInterfaceModel{Type: model},
			Alias:  &libvirtxml.DomainAlias{Name: name},
		})
	}
	return out
}

// WithRootPorts is d with n pcie-root-port controllers after its own, as KubeVirt appends them
// (appendPCIeRootPortControllers): indexes from one above d's highest PCI controller index, with
// no address, none beyond bus index 31.
func WithRootPorts(d *libvirtxml.Domain, n int) *libvirtxml.Domain {
	out := copyDomain(d)
	next := uint(0)
	for _, c := range out.Devices.Controllers {
		if c.Type == "pci" && c.Index != nil {
			next = max(next, *c.Index)
		}
	}
	for i := range uint(n) {
		index := next + 1 + i
		if index > maxPCIBusIndex {
			break
		}
		out.Devices.Controllers = append(out.Devices.Controllers, libvirtxml.DomainController{Type: "pci", Index: &index, Model: "pcie-root-port"})
	}
	return out
}

// Readback is the domain of the second call: libvirt's read-back of the first definition
// (readback, inactive) for its <devices>, with original's NICs in place of the read-back's, and
// original for everything else. (KubeVirt parses the read-back into its own schema, which also
// drops what that schema lacks, such as a pcie-root-port's chassis; the double keeps it.)
func Readback(original, readback *libvirtxml.Domain) *libvirtxml.Domain {
	out := copyDomain(original)
	devices := copyDomain(&libvirtxml.Domain{Devices: readback.Devices}).Devices
	devices.Interfaces = copyDomain(original).Devices.Interfaces
	out.Devices = devices
	return out
}

// Calls is how many times KubeVirt's define sequence calls the hook for d.
func Calls(d *libvirtxml.Domain) int {
	calls := 1
	if Placeholders(d) > 0 {
		calls++
	}
	if ExtraRootPorts(d) > 0 {
		calls++
	}
	return calls
}

// DefineSequence runs KubeVirt's define sequence for d: hook is the sidecar's OnDefineDomain,
// define defines a domain's XML in libvirt and returns libvirt's inactive XML of it. It returns
// the domain that the last call gave, which is the one libvirt holds.
func DefineSequence(d *libvirtxml.Domain, hook func([]byte) ([]byte, error), define func([]byte) ([]byte, error)) ([]byte, error) {
	call := func(d *libvirtxml.Domain) ([]byte, error) {
		out, err := hook(mustMarshal(d))
		if err != nil {
			return nil, err
		}
		if _, err := define(out); err != nil {
			return nil, err
		}
		return out, nil
	}
	n, extra := Placeholders(d), ExtraRootPorts(d) // both of the converter's domain
	spec := d
	if n > 0 {
		first, err := hook(mustMarshal(WithPlaceholders(d, n)))
		if err != nil {
			return nil, fmt.Errorf("the first call (with %d placeholder NICs): %w", n, err)
		}
		inactive, err := define(first)
		if err != nil {
			return nil, fmt.Errorf("the first definition: %w", err)
		}
		var rb libvirtxml.Domain
		if err := rb.Unmarshal(string(inactive)); err != nil {
			return nil, fmt.Errorf("libvirt's read-back: %w", err)
		}
		spec = Readback(d, &rb)
	}
	out, err := call(spec)
	if err != nil {
		return nil, fmt.Errorf("the call on the domain (placeholders: %d): %w", n, err)
	}
	if extra == 0 {
		return out, nil
	}
	var last libvirtxml.Domain
	if err := last.Unmarshal(string(out)); err != nil {
		return nil, fmt.Errorf("the hook's output: %w", err)
	}
	out, err = call(WithRootPorts(&last, extra))
	if err != nil {
		return nil, fmt.Errorf("the last call (with %d more root ports): %w", extra, err)
	}
	return out, nil
}

func mustMarshal(d *libvirtxml.Domain) []byte {
	s, err := d.Marshal()
	if err != nil {
		panic(err)
	}
	return []byte(s)
}

// copyDomain is a deep copy of d, through its XML.
func copyDomain(d *libvirtxml.Domain) *libvirtxml.Domain {
	var out libvirtxml.Domain
	if err := out.Unmarshal(string(mustMarshal(d))); err != nil {
		panic(err)
	}
	return &out
}
