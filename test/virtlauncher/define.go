package virtlauncher

import (
	"fmt"
	"strings"

	"libvirt.org/go/libvirtxml"
)

// This file is KubeVirt v1.9's define sequence, as virt-launcher runs it for a new domain
// (manager.go's allocateHotplugPorts and network's WithNetworkIfacesResources): on a machine
// that supports PCIe hot-plug (q35), the hook is called on the domain with placeholder NICs that
// reserve hot-plug ports, libvirt defines the result, virt-launcher reads it back and calls the
// hook again on a domain whose <devices> are libvirt's (with its own NICs put back in place of
// the read-back's) and whose every other element is its original; the second call's output is
// the domain. On other machines (pc) the hook is called once.

// hotplugNICs is how many NICs KubeVirt reserves PCIe ports for, placeholders included
// (calculateHotplugPortCountV1, without the pci-interface-slot-count annotation).
const hotplugNICs = 4

// Placeholders is how many placeholder NICs KubeVirt adds to the first call on d.
func Placeholders(d *libvirtxml.Domain) int {
	if d.OS == nil || d.OS.Type == nil || !strings.Contains(d.OS.Type.Machine, "q35") || d.Devices == nil || len(d.Devices.Interfaces) == 0 {
		return 0
	}
	return max(0, hotplugNICs-len(d.Devices.Interfaces))
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

// DefineSequence runs KubeVirt's define sequence for d: hook is the sidecar's OnDefineDomain,
// define defines a domain's XML in libvirt and returns libvirt's inactive XML of it. It returns
// the domain that the last call gave, which is the one libvirt holds.
func DefineSequence(d *libvirtxml.Domain, hook func([]byte) ([]byte, error), define func([]byte) ([]byte, error)) ([]byte, error) {
	call := func(d *libvirtxml.Domain) ([]byte, error) {
		in, err := d.Marshal()
		if err != nil {
			return nil, err
		}
		out, err := hook([]byte(in))
		if err != nil {
			return nil, err
		}
		if _, err := define(out); err != nil {
			return nil, err
		}
		return out, nil
	}
	n := Placeholders(d)
	if n == 0 {
		return call(d)
	}
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
	out, err := call(Readback(d, &rb))
	if err != nil {
		return nil, fmt.Errorf("the second call (on libvirt's read-back): %w", err)
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
