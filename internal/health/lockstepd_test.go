package health

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

func TestLockstepd(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	withAddress := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{ftv1.AnnotationNodeLoggingAddress: "10.0.0.1:7410"}}}
	lease := func(renewed time.Duration) *coordinationv1.Lease {
		return &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: now.Add(-renewed)}, LeaseDurationSeconds: ptr.To(int32(40))}}
	}
	for _, c := range []struct {
		name    string
		node    *corev1.Node
		lease   *coordinationv1.Lease
		running bool
		expired time.Time
	}{
		{"no node", nil, nil, false, time.Time{}},
		{"a node where lockstepd never started", &corev1.Node{}, lease(time.Second), false, time.Time{}},
		{"renewed 10s ago", withAddress, lease(10 * time.Second), true, time.Time{}},
		{"renewed 39s ago", withAddress, lease(39 * time.Second), true, time.Time{}},
		{"renewed 41s ago: ran out a second ago", withAddress, lease(41 * time.Second), false, now.Add(-time.Second)},
		{"a lockstepd from before the lease", withAddress, nil, true, time.Time{}},
		{"a lease never renewed, made a minute ago", withAddress, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(now.Add(-time.Minute))}},
			false, now.Add(-20 * time.Second)},
	} {
		// The operator saw each renewal as it was written (its clock and the node's agree here).
		var seen time.Time
		if c.lease != nil {
			seen = c.lease.CreationTimestamp.Time
			if c.lease.Spec.RenewTime != nil {
				seen = c.lease.Spec.RenewTime.Time
			}
		}
		running, expired := Lockstepd(c.node, c.lease, seen, now)
		if running != c.running || !expired.Equal(c.expired) {
			t.Errorf("%s: running %v, expired %v; want %v, %v", c.name, running, expired, c.running, c.expired)
		}
	}
}

// A node whose clock is ten minutes behind writes renew times ten minutes old: the operator goes
// by when it saw each renewal, so a lockstepd that renews runs, and one that stopped ran out a
// lease duration after the operator last saw it renew.
func TestLockstepdOnANodeWhoseClockIsOff(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{ftv1.AnnotationNodeLoggingAddress: "10.0.0.1:7410"}}}
	behind := &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: now.Add(-10 * time.Minute)}, LeaseDurationSeconds: ptr.To(int32(40))}}
	if running, _ := Lockstepd(node, behind, now.Add(-5*time.Second), now); !running {
		t.Error("a lockstepd seen renewing 5 s ago, on a node whose clock is 10 minutes behind, does not run")
	}
	ahead := &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: now.Add(10 * time.Minute)}, LeaseDurationSeconds: ptr.To(int32(40))}}
	if running, expired := Lockstepd(node, ahead, now.Add(-time.Minute), now); running || !expired.Equal(now.Add(-20*time.Second)) {
		t.Errorf("a lockstepd last seen renewing a minute ago, on a node whose clock is 10 minutes ahead: running %v, expired %v", running, expired)
	}
}

// TestWithoutLockstepd: a running secondary on a node whose lockstepd stopped is suspect from
// when its lease ran out, and lost a grace later; a verdict that is not Running stands.
func TestWithoutLockstepd(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	grace := time.Minute
	running := Verdict{State: Running, Reason: "Running"}
	v := WithoutLockstepd(running, "n1", now.Add(-20*time.Second), now, grace)
	if v.State != Suspect || v.Reason != ReasonLockstepdNotRunning || v.RecheckAfter != 40*time.Second {
		t.Errorf("20s after the lease ran out: %+v", v)
	}
	if v := WithoutLockstepd(running, "n1", now.Add(-time.Minute), now, grace); v.State != Lost || v.Reason != ReasonLockstepdNotRunning {
		t.Errorf("a grace after: %+v", v)
	}
	if v := WithoutLockstepd(running, "n1", time.Time{}, now, grace); v.State != Lost {
		t.Errorf("a node where lockstepd never ran: %+v", v)
	}
	lost := Verdict{State: Lost, Reason: ReasonNodeDeleted}
	if v := WithoutLockstepd(lost, "n1", now.Add(-time.Hour), now, grace); v != lost {
		t.Errorf("a lost member: %+v", v)
	}
}
