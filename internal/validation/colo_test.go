package validation

import (
	"strings"
	"testing"

	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/member"
)

// TestValidateCOLO: what COLO cannot replicate is refused, each with its field and what to use
// instead; read-only disks made from the VMI pass.
func TestValidateCOLO(t *testing.T) {
	withCloudInit := valid()
	withCloudInit.Spec.Template.Spec.Volumes = append(withCloudInit.Spec.Template.Spec.Volumes,
		virtv1.Volume{Name: "cloudinit", VolumeSource: virtv1.VolumeSource{CloudInitNoCloud: &virtv1.CloudInitNoCloudSource{UserData: "#cloud-config"}}},
		virtv1.Volume{Name: "cm", VolumeSource: virtv1.VolumeSource{ConfigMap: &virtv1.ConfigMapVolumeSource{}}})
	if errs := ValidateCOLO(withCloudInit); len(errs) != 0 {
		t.Fatalf("a VM on a claim with cloud-init and a config map: %v", errs)
	}
	onDataVolumes := valid()
	onDataVolumes.Spec.Template.Spec.Volumes[0].VolumeSource = virtv1.VolumeSource{DataVolume: &virtv1.DataVolumeSource{Name: "os"}}
	onDataVolumes.Spec.Template.Spec.Volumes = append(onDataVolumes.Spec.Template.Spec.Volumes,
		virtv1.Volume{Name: "data", VolumeSource: virtv1.VolumeSource{DataVolume: &virtv1.DataVolumeSource{Name: "blank"}}})
	if errs := ValidateCOLO(onDataVolumes); len(errs) != 0 {
		t.Fatalf("a VM on DataVolumes: %v", errs)
	}
	add := func(v virtv1.Volume) func(*ftv1.FaultTolerantVM) {
		return func(f *ftv1.FaultTolerantVM) { f.Spec.Template.Spec.Volumes = append(f.Spec.Template.Spec.Volumes, v) }
	}
	for _, c := range []struct {
		name   string
		mutate func(*ftv1.FaultTolerantVM)
		field  string
		want   string
		others int // errors before the one wanted
	}{
		{"a containerDisk", add(virtv1.Volume{Name: "os", VolumeSource: virtv1.VolumeSource{ContainerDisk: &virtv1.ContainerDiskSource{Image: "quay.io/x"}}}),
			"spec.template.spec.volumes[1].containerDisk", "import the image into a DataVolume", 0},
		{"an emptyDisk", add(virtv1.Volume{Name: "scratch", VolumeSource: virtv1.VolumeSource{EmptyDisk: &virtv1.EmptyDiskSource{}}}),
			"spec.template.spec.volumes[1].emptyDisk", "use a blank DataVolume", 0},
		{"an ephemeral volume", add(virtv1.Volume{Name: "eph", VolumeSource: virtv1.VolumeSource{Ephemeral: &virtv1.EphemeralVolumeSource{}}}),
			"spec.template.spec.volumes[1].ephemeral", "use the claim as a persistentVolumeClaim", 0},
		{"a volume named as an overlay", func(f *ftv1.FaultTolerantVM) { f.Spec.Template.Spec.Volumes[0].Name = "colo-hidden-2" },
			"spec.template.spec.volumes[0].name", "for the COLO overlays", 0},
		{"no claim at all", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Volumes = []virtv1.Volume{{Name: "os", VolumeSource: virtv1.VolumeSource{CloudInitNoCloud: &virtv1.CloudInitNoCloudSource{}}}}
		}, "spec.template.spec.volumes", "at least one persistentVolumeClaim or dataVolume", 0},
		{"its only claim a CD-ROM", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Devices.Disks = []virtv1.Disk{{Name: "root", DiskDevice: virtv1.DiskDevice{CDRom: &virtv1.CDRomTarget{}}}}
		}, "spec.template.spec.volumes", "not a CD-ROM", 1},
		{"a CD-ROM on a claim beside the root disk", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Devices.Disks = append(f.Spec.Template.Spec.Domain.Devices.Disks, virtv1.Disk{Name: "installer", DiskDevice: virtv1.DiskDevice{CDRom: &virtv1.CDRomTarget{}}})
			f.Spec.Template.Spec.Volumes = append(f.Spec.Template.Spec.Volumes, virtv1.Volume{Name: "installer", VolumeSource: virtv1.VolumeSource{DataVolume: &virtv1.DataVolumeSource{Name: "win-iso"}}})
		}, "spec.template.spec.volumes[1]", "the secondary's copy of the claim would be blank", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := valid()
			c.mutate(f)
			errs := ValidateCOLO(f)
			if len(errs) != 1+c.others || errs[c.others].Field != c.field || !strings.Contains(errs[c.others].Error(), c.want) {
				t.Fatalf("got %v, want %d errors, the last on %s saying %q", errs, 1+c.others, c.field, c.want)
			}
		})
	}
	for i := range 4 {
		active, hidden := member.Overlays(i)
		if !reservedOverlayName(active) || !reservedOverlayName(hidden) {
			t.Errorf("overlay names %s, %s are not reserved", active, hidden)
		}
	}
	for _, free := range []string{"colo-activity", "colo-active-x", "colo-hidden-", "root"} {
		if reservedOverlayName(free) {
			t.Errorf("%q is reserved", free)
		}
	}
}
