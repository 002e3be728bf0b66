package controllers

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/health"
	"github.com/lockstep-dev/lockstep/internal/member"
)

// TestUnderCOLOOnlyLockstepdMarksASecondarySynchronized: a secondary that ran beside a healthy
// primary on a node without lockstepd is marked synchronized by the operator's inference only
// without COLO. Under COLO its state could have come only through lockstepd, so it holds nothing:
// the operator never marks it (and, unmarked, it is never promoted).
func TestUnderCOLOOnlyLockstepdMarksASecondarySynchronized(t *testing.T) {
	for _, colo := range []bool{true, false} {
		var marked bool
		// The fake client cannot patch a VMI (its converter refuses KubeVirt's uint64 fields):
		// the test records the patch the phase sends.
		c := fake.NewClientBuilder().WithScheme(runtime.NewScheme()).WithInterceptorFuncs(interceptor.Funcs{
			Patch: func(_ context.Context, _ client.WithWatch, obj client.Object, _ client.Patch, _ ...client.PatchOption) error {
				_, marked = obj.GetAnnotations()[ftv1.AnnotationSyncedAt]
				return nil
			}}).Build()
		r := &FaultTolerantVMReconciler{Sightings: &Sightings{}, Client: c, Clock: clock.RealClock{}, Config: Config{Member: member.Options{COLO: member.COLO{Enabled: colo}}}}
		running := health.Verdict{State: health.Running}
		s := &scope{
			primary:   &memberView{vmi: &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm-1"}}, verdict: running, lockstepd: true},
			secondary: &memberView{vmi: &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm-2"}}, verdict: running, lockstepd: false},
		}
		if err := r.phaseMarkSynced(context.Background(), s); err != nil {
			t.Fatal(err)
		}
		if marked == colo {
			t.Errorf("COLO %v: the secondary on a node without lockstepd marked synchronized: %v, want %v", colo, marked, !colo)
		}
	}
}
