package member

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// TestCOLOMembers: with COLO on, both members carry the overlays at the replicated disk's size
// and name that disk for the hook; only the secondary starts paused; the hook sidecar is added
// when its image is set. A template whose disk is not a claim of known size is refused.
func TestCOLOMembers(t *testing.T) {
	ftvm := testFTVM()
	tmpl := Normalize(ftvm.UID, ftvm.Spec.Template)
	opts := Options{COLO: COLO{Enabled: true, HookSidecarImage: "ghcr.io/lockstep-dev/lockstep-operator:dev", RunDir: "/var/run/lockstep", CPUModel: "Skylake-Server"}}
	disks, err := ReplicatedDisks(&tmpl.Spec)
	if err != nil {
		t.Fatal(err)
	}
	disk := disks[0]
	volume := disk
	size := resource.MustParse("10Gi")
	build := func(role string) *virtv1.VirtualMachineInstance {
		m := Member{Ordinal: 1, Role: role, Node: "n1", Since: time.Unix(0, 0), DiskSizes: map[string]resource.Quantity{volume: size}}
		if role == ftv1.RoleSecondary {
			m.DiskBytes = DiskBytes{volume: size.Value()}
		}
		vmi, err := Build(ftvm, tmpl, m, opts)
		if err != nil {
			t.Fatal(err)
		}
		return vmi
	}
	p, s := build(ftv1.RolePrimary), build(ftv1.RoleSecondary)
	for _, vmi := range []*virtv1.VirtualMachineInstance{p, s} {
		if vmi.Annotations[ftv1.AnnotationReplicatedDisk] != disk {
			t.Errorf("%s: replicated disk %q, want %q", vmi.Labels[ftv1.LabelRole], vmi.Annotations[ftv1.AnnotationReplicatedDisk], disk)
		}
		found := 0
		for _, v := range vmi.Spec.Volumes {
			if (v.Name == ftv1.DiskColoActive || v.Name == ftv1.DiskColoHidden) && v.EmptyDisk != nil && v.EmptyDisk.Capacity.Cmp(size) == 0 {
				found++
			}
		}
		if found != 2 {
			t.Errorf("%s: the overlays are not emptyDisks of %s: %+v", vmi.Labels[ftv1.LabelRole], size.String(), vmi.Spec.Volumes)
		}
		if vmi.Spec.Domain.CPU.Model != "Skylake-Server" {
			t.Errorf("%s: CPU model %q", vmi.Labels[ftv1.LabelRole], vmi.Spec.Domain.CPU.Model)
		}
		var sidecars []struct {
			Image   string   `json:"image"`
			Command []string `json:"command"`
			Args    []string `json:"args"`
		}
		if err := json.Unmarshal([]byte(vmi.Annotations[HookSidecarsAnnotation]), &sidecars); err != nil || len(sidecars) != 1 ||
			sidecars[0].Image != opts.COLO.HookSidecarImage || len(sidecars[0].Command) != 1 || sidecars[0].Command[0] != "/lockstep-kubevirt-hook" ||
			!strings.Contains(strings.Join(sidecars[0].Args, " "), "--run-dir /var/run/lockstep") {
			t.Errorf("hook sidecar: %q (%v)", vmi.Annotations[HookSidecarsAnnotation], err)
		}
	}
	guest, _ := GuestMemory(&tmpl.Spec)
	// Every member reserves the writes its QEMU may hold for the secondary, per replicated disk.
	primary := guest.DeepCopy()
	primary.Add(*resource.NewQuantity(int64(len(disks))*WriteBehindPerDisk, resource.BinarySI))
	secondary := primary.DeepCopy()
	secondary.Add(guest)
	for _, c := range []struct {
		vmi  *virtv1.VirtualMachineInstance
		want resource.Quantity
	}{{p, primary}, {s, secondary}} {
		res := c.vmi.Spec.Domain.Resources
		if res.Requests.Memory().Cmp(c.want) != 0 || res.Limits.Memory().Cmp(c.want) != 0 || c.vmi.Spec.Domain.Memory.Guest.Cmp(guest) != 0 {
			t.Errorf("%s: memory request %s, limit %s, guest %s; want %s reserved (the secondary's RAM cache too, and the writes behind) and the guest's %s",
				c.vmi.Labels[ftv1.LabelRole], res.Requests.Memory(), res.Limits.Memory(), c.vmi.Spec.Domain.Memory.Guest, c.want.String(), guest.String())
		}
	}
	if p.Spec.StartStrategy != nil || s.Spec.StartStrategy == nil || *s.Spec.StartStrategy != virtv1.StartStrategyPaused {
		t.Errorf("start strategies: primary %v, secondary %v", p.Spec.StartStrategy, s.Spec.StartStrategy)
	}
	passthrough := *tmpl.DeepCopy()
	passthrough.Spec.Domain.CPU = &virtv1.CPU{Model: virtv1.CPUModeHostPassthrough}
	if _, err := Build(ftvm, passthrough, Member{Role: ftv1.RolePrimary, Node: "n1", DiskSizes: map[string]resource.Quantity{volume: size}}, opts); err == nil ||
		!strings.Contains(err.Error(), "name a model both nodes have") {
		t.Errorf("host-passthrough: %v", err)
	}
	if _, err := Build(ftvm, tmpl, Member{Role: ftv1.RolePrimary, Node: "n1"}, opts); err == nil || !strings.Contains(err.Error(), "whose claim's size is not known") {
		t.Errorf("a disk of unknown size: %v", err)
	}
	if p.Annotations[ftv1.AnnotationDiskBytes] != "" || s.Annotations[ftv1.AnnotationDiskBytes] != volume+"=10737418240" {
		t.Errorf("disk sizes: primary %q (want none: it starts from the template's claims), secondary %q",
			p.Annotations[ftv1.AnnotationDiskBytes], s.Annotations[ftv1.AnnotationDiskBytes])
	}
}

// TestCOLOSecondaryIsSizedFromItsPrimary: a secondary's overlays and its disk-bytes annotation
// are the primary's disk sizes, not its claims' (which a storage class rounds, and which hold the
// filesystem's overhead too); a disk whose size is not a whole MiB, which no KubeVirt emptyDisk
// can match, is refused with what to do; a secondary without its primary's sizes is refused.
func TestCOLOSecondaryIsSizedFromItsPrimary(t *testing.T) {
	ftvm := testFTVM()
	tmpl := Normalize(ftvm.UID, ftvm.Spec.Template)
	opts := Options{COLO: COLO{Enabled: true}}
	disks, err := ReplicatedDisks(&tmpl.Spec)
	if err != nil {
		t.Fatal(err)
	}
	volume := disks[0]
	claim := map[string]resource.Quantity{volume: resource.MustParse("11Gi")}
	const disk = 9_663_676_416 // 9216 MiB: what CDI made of a 10Gi claim, say
	for _, role := range []string{ftv1.RoleSecondary, ftv1.RolePrimary} {
		vmi, err := Build(ftvm, tmpl, Member{Ordinal: 3, Role: role, Node: "n1", DiskSizes: claim, DiskBytes: DiskBytes{volume: disk, "other": MiB}}, opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := vmi.Annotations[ftv1.AnnotationDiskBytes]; got != volume+"=9663676416" {
			t.Errorf("%s: disk sizes %q, want only the replicated disk's", role, got)
		}
		for _, v := range vmi.Spec.Volumes {
			if (v.Name == ftv1.DiskColoActive || v.Name == ftv1.DiskColoHidden) && (v.EmptyDisk == nil || v.EmptyDisk.Capacity.Value() != disk) {
				t.Errorf("%s: overlay %s is %+v, want an emptyDisk of %d bytes", role, v.Name, v.VolumeSource, disk)
			}
		}
	}
	_, err = Build(ftvm, tmpl, Member{Ordinal: 3, Role: ftv1.RoleSecondary, Node: "n1", DiskSizes: claim, DiskBytes: DiskBytes{volume: disk + 512}}, opts)
	if !errors.Is(err, ErrDiskSizeUnsupported) || !strings.Contains(err.Error(), "9663676928 bytes") || !strings.Contains(err.Error(), "multiple of 1 MiB") {
		t.Errorf("a disk of 9216 MiB and 512 bytes: %v", err)
	}
	_, err = Build(ftvm, tmpl, Member{Ordinal: 3, Role: ftv1.RoleSecondary, Node: "n1", DiskSizes: claim}, opts)
	if err == nil || !strings.Contains(err.Error(), "primary's disk sizes") {
		t.Errorf("a secondary without its primary's sizes: %v", err)
	}
	_, err = Build(ftvm, tmpl, Member{Ordinal: 3, Role: ftv1.RoleSecondary, Node: "n1", DiskSizes: claim, DiskBytes: DiskBytes{"other": MiB}}, opts)
	if err == nil || !strings.Contains(err.Error(), "is not known") {
		t.Errorf("sizes that miss the replicated disk: %v", err)
	}
}

// TestEveryClaimIsReplicated: a template with two claims (and a CD-ROM on a third, which is not
// replicated) gets both named in order for the hook, each with its own overlays at its own size:
// before, only the first was replicated and the secondary's copy of the second stayed blank.
func TestEveryClaimIsReplicated(t *testing.T) {
	ftvm := testFTVM()
	claim := func(name, claim string) virtv1.Volume {
		return virtv1.Volume{Name: name, VolumeSource: virtv1.VolumeSource{PersistentVolumeClaim: &virtv1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}
	}
	ftvm.Spec.Template.Spec.Volumes = append(ftvm.Spec.Template.Spec.Volumes, claim("installer", "db-installer"), claim("data", "db-data"))
	ftvm.Spec.Template.Spec.Domain.Devices.Disks = []virtv1.Disk{{Name: "root"}, {Name: "installer", DiskDevice: virtv1.DiskDevice{CDRom: &virtv1.CDRomTarget{}}}, {Name: "data"}}
	tmpl := Normalize(ftvm.UID, ftvm.Spec.Template)
	sizes := map[string]resource.Quantity{"root": resource.MustParse("10Gi"), "data": resource.MustParse("50Gi")}
	bytes := DiskBytes{"root": 10 << 30, "data": 50 << 30}
	vmi, err := Build(ftvm, tmpl, Member{Ordinal: 2, Role: ftv1.RoleSecondary, Node: "n1", Since: time.Unix(0, 0), DiskSizes: sizes, DiskBytes: bytes}, Options{COLO: COLO{Enabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	if got := vmi.Annotations[ftv1.AnnotationReplicatedDisk]; got != "root,data" {
		t.Errorf("replicated disks %q, want \"root,data\"", got)
	}
	if got := ParseReplicatedDisks(vmi.Annotations[ftv1.AnnotationReplicatedDisk]); len(got) != 2 || got[0] != "root" || got[1] != "data" {
		t.Errorf("parsed back: %v", got)
	}
	want := map[string]string{"colo-active": "10Gi", "colo-hidden": "10Gi", "colo-active-1": "50Gi", "colo-hidden-1": "50Gi"}
	for _, v := range vmi.Spec.Volumes {
		if size, ok := want[v.Name]; ok {
			if v.EmptyDisk == nil || v.EmptyDisk.Capacity.String() != size {
				t.Errorf("overlay %s: %+v, want an emptyDisk of %s", v.Name, v.VolumeSource, size)
			}
			delete(want, v.Name)
		}
	}
	if len(want) != 0 {
		t.Errorf("overlays missing: %v", want)
	}

	// A dataVolume is its claim: replicated, and a member's copy of it is a plain claim; the
	// member on the DataVolume's own claim keeps the dataVolume volume (KubeVirt waits for it).
	onDV := ftvm.DeepCopy()
	onDV.Spec.Template.Spec.Volumes[2].VolumeSource = virtv1.VolumeSource{DataVolume: &virtv1.DataVolumeSource{Name: "db-data"}}
	dvTmpl := Normalize(onDV.UID, onDV.Spec.Template)
	for _, c := range []struct{ claim, wantPVC, wantDV string }{{"vm-2-data", "vm-2-data", ""}, {"db-data", "", "db-data"}} {
		vmi, err := Build(onDV, dvTmpl, Member{Ordinal: 2, Role: ftv1.RoleSecondary, Node: "n1", DiskSizes: sizes, DiskBytes: bytes,
			Claims: map[string]string{"data": c.claim}}, Options{COLO: COLO{Enabled: true}})
		if err != nil {
			t.Fatal(err)
		}
		if got := vmi.Annotations[ftv1.AnnotationReplicatedDisk]; got != "root,data" {
			t.Errorf("on a dataVolume: replicated disks %q, want \"root,data\"", got)
		}
		for _, v := range vmi.Spec.Volumes {
			if v.Name != "data" {
				continue
			}
			pvc, dv := "", ""
			if v.PersistentVolumeClaim != nil {
				pvc = v.PersistentVolumeClaim.ClaimName
			}
			if v.DataVolume != nil {
				dv = v.DataVolume.Name
			}
			if pvc != c.wantPVC || dv != c.wantDV {
				t.Errorf("claim %s: the volume is claim %q, dataVolume %q; want %q, %q", c.claim, pvc, dv, c.wantPVC, c.wantDV)
			}
		}
	}

	delete(sizes, "data")
	if _, err := Build(ftvm, tmpl, Member{Ordinal: 2, Role: ftv1.RolePrimary, Node: "n1", DiskSizes: sizes}, Options{COLO: COLO{Enabled: true}}); err == nil || !strings.Contains(err.Error(), `"data"`) {
		t.Errorf("a second claim of unknown size: %v, want an error that names it", err)
	}
}
