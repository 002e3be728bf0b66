package validation

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/member"
)

// ValidateCOLO returns the reasons a VM cannot be protected by QEMU's COLO (lockstep's --colo).
// COLO replicates the VM's memory and each of its disks on a claim: a disk whose writes live in
// the launcher pod (a containerDisk's overlay, an emptyDisk, an ephemeral volume's overlay) is
// replicated by nothing, and after a failover the guest would find its writes gone. Such a VM is
// refused rather than protected in half, as is a CD-ROM on a claim (the secondary's copy of a
// claim that is not replicated is blank). Read-only disks made from the VMI (cloud-init, config
// maps, secrets) are the same on both members and pass.
func ValidateCOLO(ftvm *ftv1.FaultTolerantVM) field.ErrorList {
	var errs field.ErrorList
	path := field.NewPath("spec", "template", "spec", "volumes")
	cdrom := map[string]bool{}
	for _, d := range ftvm.Spec.Template.Spec.Domain.Devices.Disks {
		cdrom[d.Name] = d.CDRom != nil
	}
	for i, v := range ftvm.Spec.Template.Spec.Volumes {
		p := path.Index(i)
		switch {
		case cdrom[v.Name] && member.ClaimOf(&v) != "":
			errs = append(errs, field.Forbidden(p,
				"a CD-ROM on a claim: COLO replicates disks, not CD-ROMs, so the secondary's copy of the claim would be blank and a failover would take the guest's medium away; "+
					"attach the image as a disk, or remove the CD-ROM once the guest no longer needs it"))
		case v.ContainerDisk != nil:
			errs = append(errs, field.Forbidden(p.Child("containerDisk"),
				"a containerDisk's writes go to an overlay in its launcher pod, which COLO does not replicate, so a failover would lose them; "+
					"import the image into a DataVolume and use it as a dataVolume volume"))
		case v.EmptyDisk != nil:
			errs = append(errs, field.Forbidden(p.Child("emptyDisk"),
				"an emptyDisk lives and dies with its launcher pod and COLO does not replicate it, so a failover would lose what the guest wrote; use a blank DataVolume (or a persistentVolumeClaim)"))
		case v.Ephemeral != nil:
			errs = append(errs, field.Forbidden(p.Child("ephemeral"),
				"an ephemeral volume's writes go to an overlay in its launcher pod, which COLO does not replicate, so a failover would lose them; use the claim as a persistentVolumeClaim (or clone it into a DataVolume)"))
		}
		if reservedOverlayName(v.Name) {
			errs = append(errs, field.Invalid(p.Child("name"), v.Name,
				"the names "+ftv1.DiskColoActive+"[-<n>] and "+ftv1.DiskColoHidden+"[-<n>] are lockstep's, for the COLO overlays of each replicated disk"))
		}
	}
	// The disks the operator would replicate (member.ReplicatedDisks: claims that are not CD-ROMs).
	if _, err := member.ReplicatedDisks(&ftvm.Spec.Template.Spec); err != nil {
		errs = append(errs, field.Required(path,
			"COLO replicates the VM's disks on claims: the template needs at least one persistentVolumeClaim or dataVolume volume that is a disk, not a CD-ROM (the root disk)"))
	}
	return errs
}

// reservedOverlayName says whether name is one of the names member.Overlays gives (or could).
func reservedOverlayName(name string) bool {
	for _, base := range []string{ftv1.DiskColoActive, ftv1.DiskColoHidden} {
		if name == base || (strings.HasPrefix(name, base+"-") && strings.Trim(name[len(base)+1:], "0123456789") == "" && len(name) > len(base)+1) {
			return true
		}
	}
	return false
}

// ClaimProblem says why a claim cannot back a protected VM's disk ("" if it can): under COLO, a
// block-mode claim (the KubeVirt hook replicates the disk.img of a filesystem claim; a block
// device is not supported yet).
func ClaimProblem(pvc *corev1.PersistentVolumeClaim, colo bool) string {
	if colo && pvc.Spec.VolumeMode != nil && *pvc.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		return "is a block-mode claim, which lockstep's COLO does not replicate yet: use a claim of volumeMode Filesystem (a DataVolume with storage.volumeMode Filesystem)"
	}
	return ""
}
