package controllers

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/member"
)

// TestUnderCOLOABlockModeClaimIsRefusedWhenItAppears: a block-mode claim made after the
// FaultTolerantVM was admitted (the webhook let it through, as it did not exist yet) is refused
// when the operator gives a member its disks, with the volume, the claim and what to use; the
// error is the one the status shows for a missing claim (DiskNotFound). Without COLO it is used.
func TestUnderCOLOABlockModeClaimIsRefusedWhenItAppears(t *testing.T) {
	block := corev1.PersistentVolumeBlock
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "raw"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeMode: &block}}
	ftvm := &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm"}}
	spec := &virtv1.VirtualMachineInstanceSpec{Volumes: []virtv1.Volume{{Name: "root", VolumeSource: virtv1.VolumeSource{DataVolume: &virtv1.DataVolumeSource{Name: "raw"}}}}}
	for _, colo := range []bool{true, false} {
		c := fake.NewClientBuilder().WithScheme(NewScheme()).WithObjects(pvc).Build()
		r := &FaultTolerantVMReconciler{Sightings: &Sightings{}, Client: c, APIReader: c, Scheme: NewScheme(), Config: Config{Member: member.Options{COLO: member.COLO{Enabled: colo}}}}
		disks, err := r.ensureMemberClaims(context.Background(), ftvm, spec, "vm-1", member.Member{Ordinal: 1, Role: ftv1.RolePrimary}, nil)
		claims := disks.claims
		if !colo {
			if err != nil || claims["root"] != "raw" {
				t.Fatalf("without COLO: claims %v, %v; want the block claim used", claims, err)
			}
			continue
		}
		if !errors.Is(err, errSourceClaim) || !strings.Contains(err.Error(), `volume "root": claim "raw" is a block-mode claim`) || !strings.Contains(err.Error(), "volumeMode Filesystem") {
			t.Fatalf("under COLO: %v, want the block claim refused with what to use", err)
		}
	}
}
