package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/member"
)

// TestUnderCOLOSecondariesAreSizedFromTheirPrimary follows a VM's disk sizes under COLO, as a
// real cluster makes them differ: the template's claims ask for 3Gi and 2Gi, CDI imported the
// root disk at 2903 MiB (3Gi less its filesystem overhead), and KubeVirt made the blank data
// disk 2048 MiB.
//   - The first secondary waits for the primary's sizes (WaitingForDiskSizes, naming the node
//     whose lockstepd reports them); a disk that is not a whole MiB is refused with its size.
//   - Once lockstepd measured them, the secondary's copies ask for the disk and its filesystem's
//     overhead (never less than the template's claim) and say what they hold; the secondary's
//     overlays and disk-bytes are the primary's sizes, not its claims'.
//   - After a failover, a primary started from those copies opens them at those sizes, and so
//     does the secondary made beside it, without waiting.
func TestUnderCOLOSecondariesAreSizedFromTheirPrimary(t *testing.T) {
	ctx := context.Background()
	claim := func(name, size string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: corev1.PersistentVolumeClaimSpec{
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}}
	}
	guest := resource.MustParse("1Gi")
	ftvm := &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db", UID: "db-uid"}}
	ftvm.Spec.Template.Spec.Domain = virtv1.DomainSpec{CPU: &virtv1.CPU{Cores: 1}, Memory: &virtv1.Memory{Guest: &guest},
		Devices: virtv1.Devices{Disks: []virtv1.Disk{{Name: "root"}, {Name: "data"}}}}
	ftvm.Spec.Template.Spec.Volumes = []virtv1.Volume{
		{Name: "root", VolumeSource: virtv1.VolumeSource{DataVolume: &virtv1.DataVolumeSource{Name: "db-root"}}},
		{Name: "data", VolumeSource: virtv1.VolumeSource{PersistentVolumeClaim: &virtv1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "db-data"}}}},
	}
	tmpl := member.Normalize(ftvm.UID, ftvm.Spec.Template)
	c := fake.NewClientBuilder().WithScheme(NewScheme()).WithObjects(ftvm, claim("db-root", "3Gi"), claim("db-data", "2Gi")).Build()
	r := &FaultTolerantVMReconciler{Sightings: &Sightings{}, Client: c, APIReader: c, Scheme: NewScheme(), Config: Config{Member: member.Options{COLO: member.COLO{Enabled: true}}}}
	build := func(name string, ordinal int, role string, bytes member.DiskBytes) *virtv1.VirtualMachineInstance {
		t.Helper()
		disks, err := r.ensureMemberClaims(ctx, ftvm, &tmpl.Spec, name, member.Member{Ordinal: ordinal, Role: role, Node: "node-" + name, DiskBytes: bytes}, nil)
		if err != nil {
			t.Fatal(err)
		}
		vmi, err := member.Build(ftvm, tmpl, member.Member{Ordinal: ordinal, Role: role, Node: "node-" + name, Claims: disks.claims,
			DiskSizes: disks.sizes, DiskBytes: disks.bytes}, r.Config.Member)
		if err != nil {
			t.Fatal(err)
		}
		return vmi
	}

	primary := build("db-1", 1, ftv1.RolePrimary, nil)
	if got := primary.Annotations[ftv1.AnnotationDiskBytes]; got != "" {
		t.Fatalf("a primary on the template's claims has disk sizes %q: its disks are what CDI and KubeVirt made", got)
	}
	_, err := r.secondaryDiskBytes(primary, &tmpl.Spec)
	s := &scope{ftvm: ftvm}
	if ok, reason, msg := r.memberCondition(s, nil, err, "secondary"); !errors.Is(err, errDiskSizesUnknown) || ok || reason != ftv1.ReasonWaitingForDiskSizes ||
		!strings.Contains(msg, "lockstepd on node node-db-1") {
		t.Fatalf("a secondary before lockstepd measured the primary: %v; condition %v %s %q", err, ok, reason, msg)
	}
	primary.Annotations[ftv1.AnnotationMeasuredDiskBytes] = "root=3044016128,data=2147483904" // data: 2 GiB and 256 bytes
	_, err = r.secondaryDiskBytes(primary, &tmpl.Spec)
	if ok, reason, msg := r.memberCondition(s, nil, err, "secondary"); !errors.Is(err, member.ErrDiskSizeUnsupported) || ok || reason != ftv1.ReasonDiskSizeUnsupported ||
		!strings.Contains(msg, `disk "data" is 2147483904 bytes`) {
		t.Fatalf("a disk that is not a whole MiB: %v; condition %v %s %q", err, ok, reason, msg)
	}
	primary.Annotations[ftv1.AnnotationMeasuredDiskBytes] = "root=3044016128" // a member that named one disk
	_, err = r.secondaryDiskBytes(primary, &tmpl.Spec)
	if ok, reason, msg := r.memberCondition(s, nil, err, "secondary"); !errors.Is(err, errDiskSizesUnknown) || ok || reason != ftv1.ReasonWaitingForDiskSizes ||
		!strings.Contains(msg, `disk "data" is not known`) {
		t.Fatalf("sizes that miss a disk: %v; condition %v %s %q", err, ok, reason, msg)
	}
	primary.Annotations[ftv1.AnnotationMeasuredDiskBytes] = "root=3044016128,data=2147483648" // 2903 MiB, 2048 MiB
	bytes, err := r.secondaryDiskBytes(primary, &tmpl.Spec)
	if err != nil {
		t.Fatal(err)
	}
	secondary := build("db-2", 2, ftv1.RoleSecondary, bytes)
	checkSized(t, c, secondary, map[string]copyWant{"root": {"db-2-root", "3Gi", "3044016128"}, "data": {"db-2-data", "2168Mi", "2147483648"}})

	// The primary is lost; its secondary took over, and its copies hold the VM's disks.
	for _, name := range []string{"db-2-root", "db-2-data"} {
		if err := r.markWasPrimary(ctx, "ns", name); err != nil {
			t.Fatal(err)
		}
	}
	copies, err := r.diskCopies(ctx, ftvm)
	if err != nil {
		t.Fatal(err)
	}
	restarted := build("db-3", 3, ftv1.RolePrimary, currentDiskBytes(copies, &tmpl.Spec)) // as startPair decides
	if got := restarted.Annotations[ftv1.AnnotationDiskBytes]; got != "data=2147483648,root=3044016128" {
		t.Fatalf("a primary on the copies: disk sizes %q, want the copies'", got)
	}
	bytes, err = r.secondaryDiskBytes(restarted, &tmpl.Spec)
	if err != nil {
		t.Fatalf("the secondary beside a primary on copies waits: %v", err)
	}
	checkSized(t, c, build("db-4", 4, ftv1.RoleSecondary, bytes), map[string]copyWant{"root": {"db-4-root", "3Gi", "3044016128"}, "data": {"db-4-data", "2168Mi", "2147483648"}})
}

type copyWant struct{ claim, request, bytes string }

// checkSized checks a secondary's disks: each volume on its copy, which asks for request and
// holds a disk of bytes, with overlays of that size.
func checkSized(t *testing.T, c client.Client, vmi *virtv1.VirtualMachineInstance, want map[string]copyWant) {
	t.Helper()
	b, err := member.ParseDiskBytes(vmi.Annotations[ftv1.AnnotationDiskBytes])
	if err != nil {
		t.Fatal(err)
	}
	disks := member.ParseReplicatedDisks(vmi.Annotations[ftv1.AnnotationReplicatedDisk])
	for i, volume := range disks {
		w := want[volume]
		if got := b[volume]; w.bytes == "" || fmt.Sprint(got) != w.bytes {
			t.Errorf("%s: disk %s is opened at %d bytes, want %s", vmi.Name, volume, got, w.bytes)
		}
		var pvc corev1.PersistentVolumeClaim
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: w.claim}, &pvc); err != nil {
			t.Fatal(err)
		}
		if req := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; req.Cmp(resource.MustParse(w.request)) != 0 || pvc.Annotations[ftv1.AnnotationDiskBytes] != w.bytes {
			t.Errorf("copy %s asks for %s and holds %q bytes; want %s and %s", w.claim, req.String(), pvc.Annotations[ftv1.AnnotationDiskBytes], w.request, w.bytes)
		}
		active, hidden := member.Overlays(i)
		for _, v := range vmi.Spec.Volumes {
			if (v.Name == active || v.Name == hidden) && v.EmptyDisk.Capacity.Value() != b[volume] {
				t.Errorf("%s: overlay %s is %s, want the disk's %d bytes", vmi.Name, v.Name, v.EmptyDisk.Capacity.String(), b[volume])
			}
		}
	}
}
