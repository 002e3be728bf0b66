package validation

import (
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/member"
)

// ValidateCOLO returns the reasons a VM cannot be protected by QEMU's COLO (lockstep's --colo).
// COLO replicates the VM's memory and each of its disks on a claim: a disk whose writes live in
// the launcher pod (a containerDisk's overlay, an emptyDisk, an ephemeral volume's overlay) is
// replicated by nothing, and after a failover the guest would find its writes gone. Such a VM is
// refused rather than protected in half. Read-only disks made from the VMI (cloud-init, config
// maps, secrets) are the same on both members and pass.
func ValidateCOLO(ftvm *ftv1.FaultTolerantVM) field.ErrorList {
	var errs field.ErrorList
	path := field.NewPath("spec", "template", "spec", "volumes")
	for i, v := range ftvm.Spec.Template.Spec.Volumes {
		p := path.Index(i)
		switch {
		case v.ContainerDisk != nil:
			errs = append(errs, field.Forbidden(p.Child("containerDisk"),
				"a containerDisk's writes go to an overlay in its launcher pod, which COLO does not replicate, so a failover would lose them; "+
					"import the image into a claim (a DataVolume's, once imported) and use it as a persistentVolumeClaim"))
		case v.EmptyDisk != nil:
			errs = append(errs, field.Forbidden(p.Child("emptyDisk"),
				"an emptyDisk lives and dies with its launcher pod and COLO does not replicate it, so a failover would lose what the guest wrote; use a persistentVolumeClaim"))
		case v.Ephemeral != nil:
			errs = append(errs, field.Forbidden(p.Child("ephemeral"),
				"an ephemeral volume's writes go to an overlay in its launcher pod, which COLO does not replicate, so a failover would lose them; use the claim as a persistentVolumeClaim"))
		}
		if reservedOverlayName(v.Name) {
			errs = append(errs, field.Invalid(p.Child("name"), v.Name,
				"the names "+ftv1.DiskColoActive+"[-<n>] and "+ftv1.DiskColoHidden+"[-<n>] are lockstep's, for the COLO overlays of each replicated disk"))
		}
	}
	// The disks the operator would replicate (member.ReplicatedDisks: claims that are not CD-ROMs).
	if _, err := member.ReplicatedDisks(&ftvm.Spec.Template.Spec); err != nil {
		errs = append(errs, field.Required(path,
			"COLO replicates the VM's disks on claims: the template needs at least one persistentVolumeClaim volume that is a disk, not a CD-ROM (the root disk)"))
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
