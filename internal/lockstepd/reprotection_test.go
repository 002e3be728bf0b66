package lockstepd

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/scheme"
)

func ftvmProtected(name string, status metav1.ConditionStatus, at time.Time, mutate ...func(*ftv1.FaultTolerantVM)) *ftv1.FaultTolerantVM {
	f := &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Namespace: "vms", Name: name}}
	f.Spec.RunStrategy, f.Spec.Protection = ftv1.RunStrategyRunning, ftv1.ProtectionEnabled
	f.Status.Conditions = []metav1.Condition{{Type: ftv1.ConditionProtected, Status: status, Reason: "SecondaryStarting",
		Message: "a new secondary is starting", LastTransitionTime: metav1.NewTime(at)}}
	for _, m := range mutate {
		m(f)
	}
	return f
}

func TestReprotected(t *testing.T) {
	stopped := time.Date(2026, 11, 27, 3, 0, 0, 500_000_000, time.UTC)
	cut := awaitedPair{Pair: "vms/a", Secondary: "a-2", Since: stopped}
	unknown := awaitedPair{Pair: "vms/a", Since: stopped}
	now := metav1.Now()
	secondary := func(vmi string) func(*ftv1.FaultTolerantVM) {
		return func(f *ftv1.FaultTolerantVM) { f.Status.Secondary = &ftv1.MemberStatus{VMI: vmi, Node: "node-c"} }
	}
	for _, tc := range []struct {
		name string
		ftvm *ftv1.FaultTolerantVM
		a    awaitedPair
		done bool
		why  string
	}{
		{"gone", nil, cut, true, "gone"},
		{"being deleted", ftvmProtected("a", metav1.ConditionFalse, stopped, func(f *ftv1.FaultTolerantVM) { f.DeletionTimestamp = &now }), cut, true, "deleted"},
		{"halted", ftvmProtected("a", metav1.ConditionFalse, stopped, func(f *ftv1.FaultTolerantVM) { f.Spec.RunStrategy = ftv1.RunStrategyHalted }), cut, true, "halted"},
		{"protection suspended", ftvmProtected("a", metav1.ConditionFalse, stopped, func(f *ftv1.FaultTolerantVM) { f.Spec.Protection = ftv1.ProtectionSuspended }), cut, true, "Suspended"},
		{"no condition yet", ftvmProtected("a", metav1.ConditionFalse, stopped, func(f *ftv1.FaultTolerantVM) { f.Status.Conditions = nil }), cut, false, "no Protected condition"},
		{"not protected", ftvmProtected("a", metav1.ConditionFalse, stopped.Add(time.Second), secondary("a-3")), cut, false, "Protected=False (SecondaryStarting): a new secondary is starting"},
		// The operator has not seen the protection end, or marked the secondary the restart cut
		// off synchronized after the stop: it is the same secondary, whatever the time.
		{"protected by the secondary cut off", ftvmProtected("a", metav1.ConditionTrue, stopped.Add(time.Minute), secondary("a-2")), cut, false, "from before lockstepd stopped (secondary a-2)"},
		{"protected by a new secondary", ftvmProtected("a", metav1.ConditionTrue, stopped.Add(-time.Hour), secondary("a-3")), cut, true, "by secondary a-3"},
		// Without the secondary's name, the condition's time says: whole seconds, so a transition in
		// the second of the stop may be from before it.
		{"secondary unknown, protected from before the stop", ftvmProtected("a", metav1.ConditionTrue, stopped.Truncate(time.Second), secondary("a-3")), unknown, false, "from before"},
		{"secondary unknown, protected again", ftvmProtected("a", metav1.ConditionTrue, stopped.Add(20*time.Second), secondary("a-3")), unknown, true, "Protected since"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done, why := reprotected(tc.ftvm, tc.a)
			if done != tc.done || !strings.Contains(why, tc.why) {
				t.Fatalf("reprotected = %v, %q; want %v, containing %q", done, why, tc.done, tc.why)
			}
		})
	}
}

// A lockstepd that stops leaves the pairs it kept protected; its successor is not ready until
// each is protected again, and a successor that stops while it waits hands the rest on.
func TestReprotectionGateHandsOverAndWaits(t *testing.T) {
	dir := t.TempDir()
	stopped := time.Now().Add(-time.Minute).Truncate(time.Second)
	before := &reprotectionGate{RunDir: dir}
	if err := before.handOver([]ProtectedPair{{Pair: "vms/b", Secondary: "b-2"}, {Pair: "vms/a", Secondary: "a-2"}}, stopped); err != nil {
		t.Fatal(err)
	}

	withSecondary := func(f *ftv1.FaultTolerantVM, vmi string) *ftv1.FaultTolerantVM {
		f.Status.Secondary = &ftv1.MemberStatus{VMI: vmi}
		return f
	}
	a := withSecondary(ftvmProtected("a", metav1.ConditionTrue, stopped.Add(-time.Hour)), "a-2") // the operator has not seen it yet
	b := withSecondary(ftvmProtected("b", metav1.ConditionFalse, stopped.Add(2*time.Second)), "b-3")
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(a, b).WithStatusSubresource(&ftv1.FaultTolerantVM{}).Build()
	g := &reprotectionGate{RunDir: dir, Reader: c}
	if err := g.load(time.Now()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	g.look(ctx, logr.Discard(), time.Now())
	err := g.Check(nil)
	if err == nil || !strings.Contains(err.Error(), "vms/a (its Protected condition is from before lockstepd stopped (secondary a-2))") || !strings.Contains(err.Error(), "vms/b (Protected=False") {
		t.Fatalf("readiness = %v; want both VMs awaited, with why", err)
	}

	// a is protected again, by a new secondary; b is still not, and this lockstepd stops too.
	a = withSecondary(a, "a-3")
	if err := c.Status().Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	g.look(ctx, logr.Discard(), time.Now())
	if err := g.Check(nil); err == nil || strings.Contains(err.Error(), "vms/a") || !strings.Contains(err.Error(), "vms/b") {
		t.Fatalf("readiness = %v; want vms/b alone awaited", err)
	}
	if g.Awaited() != 1 {
		t.Fatalf("awaited = %d, want 1", g.Awaited())
	}
	if err := g.handOver([]ProtectedPair{{Pair: "vms/c", Secondary: "c-2"}}, stopped.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	// A look that ends after the hand-over (lockstepd stopping) leaves the ledger to the next.
	if err := c.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	g.look(ctx, logr.Discard(), time.Now())

	next := &reprotectionGate{RunDir: dir, Reader: c}
	if err := next.load(time.Now()); err != nil {
		t.Fatal(err)
	}
	want := map[string]awaitedPair{"vms/b": {Pair: "vms/b", Secondary: "b-2", Since: stopped}, "vms/c": {Pair: "vms/c", Secondary: "c-2", Since: stopped.Add(time.Minute)}}
	if len(next.awaited) != len(want) {
		t.Fatalf("the next lockstepd awaits %v, want %v", next.awaited, want)
	}
	for _, p := range next.awaited {
		if w := want[p.Pair]; p.Secondary != w.Secondary || !p.Since.Equal(w.Since) {
			t.Fatalf("the next lockstepd awaits %v, want %v (each with the secondary and the stop that ended its protection)", next.awaited, want)
		}
	}

	// b is gone and c is protected by a new secondary: ready, and the ledger is gone.
	cvm := withSecondary(ftvmProtected("c", metav1.ConditionTrue, time.Now()), "c-3")
	if err := c.Create(ctx, cvm); err != nil {
		t.Fatal(err)
	}
	next.look(ctx, logr.Discard(), time.Now())
	if err := next.Check(nil); err != nil {
		t.Fatalf("readiness = %v; want ready", err)
	}
	if _, err := os.Stat(filepath.Join(dir, ledgerFile)); !os.IsNotExist(err) {
		t.Fatalf("the ledger is still there (%v)", err)
	}
}

func TestReprotectionGateGivesUpAfterItsTimeout(t *testing.T) {
	dir := t.TempDir()
	stopped := time.Now().Truncate(time.Second)
	ledger := []awaitedPair{{Pair: "vms/a", Secondary: "a-2", Since: stopped}}
	if err := writeLedger(dir, ledger); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(ftvmProtected("a", metav1.ConditionFalse, stopped.Add(time.Second))).Build()
	g := &reprotectionGate{RunDir: dir, Reader: c, Timeout: time.Minute}
	begun := time.Now()
	if err := g.load(begun); err != nil {
		t.Fatal(err)
	}
	g.look(context.Background(), logr.Discard(), begun.Add(59*time.Second))
	if g.Check(nil) == nil {
		t.Fatal("ready before the timeout with a VM unprotected")
	}
	g.look(context.Background(), logr.Discard(), begun.Add(time.Minute))
	if err := g.Check(nil); err != nil {
		t.Fatalf("readiness after the timeout = %v; want ready", err)
	}
	// Given up for good: neither the ledger nor a hand-over awaits it again.
	if _, err := os.Stat(filepath.Join(dir, ledgerFile)); !os.IsNotExist(err) {
		t.Fatalf("the ledger outlived the timeout (%v)", err)
	}

	// Without a timeout, it waits.
	if err := writeLedger(dir, ledger); err != nil {
		t.Fatal(err)
	}
	g = &reprotectionGate{RunDir: dir, Reader: c}
	if err := g.load(begun); err != nil {
		t.Fatal(err)
	}
	g.look(context.Background(), logr.Discard(), begun.Add(24*time.Hour))
	if g.Check(nil) == nil {
		t.Fatal("ready with a VM unprotected and no timeout")
	}
}

// A lockstepd that restarts does not start the timeout again (finding 10 of issue 58): it counts
// from when the ledger's pairs were handed over, an hour ago here.
func TestReprotectionGateTimesOutFromTheFirstHandOver(t *testing.T) {
	dir := t.TempDir()
	now := time.Now().Truncate(time.Second)
	stopped := now.Add(-time.Hour)
	if err := writeLedger(dir, []awaitedPair{{Pair: "vms/a", Secondary: "a-2", Since: stopped}}); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(ftvmProtected("a", metav1.ConditionFalse, stopped.Add(time.Second))).Build()
	g := &reprotectionGate{RunDir: dir, Reader: c, Timeout: 30 * time.Minute}
	if err := g.load(now); err != nil {
		t.Fatal(err)
	}
	g.look(context.Background(), logr.Discard(), now)
	if err := g.Check(nil); err != nil {
		t.Fatalf("a lockstepd restarted an hour after the hand-over, with a 30m timeout: %v; want ready", err)
	}
}

func TestReprotectionGateWithoutLedgerIsReady(t *testing.T) {
	g := &reprotectionGate{RunDir: t.TempDir()}
	if err := g.load(time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := g.Check(nil); err != nil || g.Awaited() != 0 {
		t.Fatalf("readiness = %v, awaited %d; want ready with nothing awaited", err, g.Awaited())
	}
}
