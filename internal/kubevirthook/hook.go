// Package kubevirthook serves internal/domainhook to KubeVirt's virt-launcher over both of
// KubeVirt's interfaces: the hook sidecar's callbacks (v1alpha3, any KubeVirt release with the
// Sidecar feature gate) and the Plugins API's domain hook (v1.9 and later, feature gate Plugins).
// It reads from the VMI what the mutation needs: the member's role and directory, and its disks
// with their sizes.
package kubevirthook

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/colo"
	"github.com/lockstep-dev/lockstep/internal/domainhook"
	"github.com/lockstep-dev/lockstep/internal/member"
)

// Name is the hook's name in KubeVirt's handshake.
const Name = "lockstep"

// LockstepQEMUMount is where a member's compute container has lockstep's QEMU image
// (hack/qemu-image.sh): config/kubevirt's member-qemu policy mounts it there, in the launcher pod
// of every member and of members only, and the image's binary loads its own loader, libraries and
// firmware from there, whatever the launcher's root holds.
const LockstepQEMUMount = "/usr/local/lockstep"

// LockstepQEMU is the image's QEMU, which the hook names as each member's emulator.
const LockstepQEMU = LockstepQEMUMount + "/bin/qemu-system-x86_64"

// Hook mutates the domains of FT members.
type Hook struct {
	// RunDir is where the members' directories are, as QEMU sees them: <run-dir>/<vmi-uid>.
	RunDir string
	// Emulator, when set, is the QEMU binary members run in place of the launcher's own
	// (LockstepQEMU, lockstep-kubevirt-hook's default).
	Emulator string
}

// aliasOf is libvirt's alias of a VMI disk in the domain KubeVirt generates.
func aliasOf(disk string) string { return "ua-" + disk }

// Where KubeVirt's virt-launcher has a VMI's disk images (KubeVirt v1.9's converter): a filesystem
// claim (a PVC, or a DataVolume's) as a raw disk.img in its mount, an emptyDisk as a qcow2 image.
const (
	claimImages     = "/var/run/kubevirt-private/vmi-disks"
	emptyDiskImages = "/var/run/libvirt/empty-disks"
)

// claimDisk is the domain's disk of a volume on a filesystem claim.
func claimDisk(volume string) domainhook.Disk {
	return domainhook.Disk{Alias: aliasOf(volume), Image: filepath.Join(claimImages, volume, "disk.img"), Format: "raw"}
}

// emptyDisk is the domain's disk of an emptyDisk volume.
func emptyDisk(volume string) domainhook.Disk {
	return domainhook.Disk{Alias: aliasOf(volume), Image: filepath.Join(emptyDiskImages, volume+".qcow2"), Format: "qcow2"}
}

// Mutate returns the domain of the VMI: a COLO member's if the VMI is one, else unchanged.
func (h *Hook) Mutate(domainXML, vmiJSON []byte) ([]byte, error) {
	vmi, m, ok, err := h.member(vmiJSON)
	if err != nil {
		return nil, err
	}
	if !ok {
		return domainXML, nil
	}
	out, err := domainhook.Mutate(domainXML, m)
	if err != nil {
		return nil, fmt.Errorf("making %s/%s a COLO member: %w", vmi.Namespace, vmi.Name, err)
	}
	return out, nil
}

// member reads the VMI and, if it is an FT member, what the mutation needs to know of it.
func (h *Hook) member(vmiJSON []byte) (*virtv1.VirtualMachineInstance, domainhook.Member, bool, error) {
	vmi := &virtv1.VirtualMachineInstance{}
	if err := json.Unmarshal(vmiJSON, vmi); err != nil {
		return nil, domainhook.Member{}, false, fmt.Errorf("the VMI does not parse: %w", err)
	}
	m, ok, err := h.memberOf(vmi)
	return vmi, m, ok, err
}

// memberOf is what the mutation needs to know of a member VMI; ok is false for a VMI that is
// not an FT member.
func (h *Hook) memberOf(vmi *virtv1.VirtualMachineInstance) (domainhook.Member, bool, error) {
	role := vmi.Labels[ftv1.LabelRole]
	if vmi.Labels[ftv1.LabelPair] == "" || (role != ftv1.RolePrimary && role != ftv1.RoleSecondary) {
		return domainhook.Member{}, false, nil
	}
	if vmi.UID == "" {
		return domainhook.Member{}, false, fmt.Errorf("member %s/%s has no UID, which names its directory", vmi.Namespace, vmi.Name)
	}
	disks, err := member.ReplicatedDisksOf(vmi)
	if err != nil {
		return domainhook.Member{}, false, fmt.Errorf("member %s/%s: %w", vmi.Namespace, vmi.Name, err)
	}
	bytes, err := member.ParseDiskBytes(vmi.Annotations[ftv1.AnnotationDiskBytes])
	if err != nil {
		return domainhook.Member{}, false, fmt.Errorf("member %s/%s: %w", vmi.Namespace, vmi.Name, err)
	}
	m := domainhook.Member{
		Secondary: role == ftv1.RoleSecondary,
		Sockets:   colo.Sockets{Dir: filepath.Join(h.RunDir, string(vmi.UID))},
		Emulator:  h.Emulator,
	}
	for i, disk := range disks {
		active, hidden := member.Overlays(i)
		m.Disks = append(m.Disks, domainhook.ReplicatedDisk{Disk: claimDisk(disk), Active: emptyDisk(active), Hidden: emptyDisk(hidden), Bytes: bytes[disk]})
	}
	return m, true, nil
}
