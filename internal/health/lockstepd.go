package health

import (
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// ReasonLockstepdNotRunning: lockstepd's node lease on the member's node ran out. Under COLO a
// secondary holds the VM's state only through its node's lockstepd, which also decides its
// go-live: one without it is suspect, then lost.
const ReasonLockstepdNotRunning = "LockstepdNotRunning"

// Lockstepd says whether lockstepd runs on node (nil: the node is gone), from its node lease
// (nil: there is none) at now, and when the lease ran out (zero while it runs). renewed is when
// the operator first saw the lease's current renewal, on its own clock: the lease's renewTime is
// the node's clock, which may be minutes off the operator's. lockstepd publishes its logging
// address on the Node when it starts and renews the lease from then on; a node with the address
// and no lease runs a lockstepd of a version before the lease, and counts as running, as it did
// then.
func Lockstepd(node *corev1.Node, lease *coordinationv1.Lease, renewed, now time.Time) (running bool, expired time.Time) {
	if node == nil || node.Annotations[ftv1.AnnotationNodeLoggingAddress] == "" {
		return false, time.Time{}
	}
	if lease == nil {
		return true, time.Time{}
	}
	duration := time.Duration(ftv1.NodeLeaseDurationSeconds) * time.Second
	if lease.Spec.LeaseDurationSeconds != nil {
		duration = time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second
	}
	end := renewed.Add(duration)
	if now.Before(end) {
		return true, time.Time{}
	}
	return false, end
}

// LeaseRenewal is the value of a lease's current renewal: its holder and renew time as their
// writer wrote them (its creation when it was never renewed), compared for equality only.
func LeaseRenewal(l *coordinationv1.Lease) string {
	renewed := "created " + l.CreationTimestamp.UTC().Format(time.RFC3339)
	switch {
	case l.Spec.RenewTime != nil:
		renewed = l.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
	case l.Spec.AcquireTime != nil:
		renewed = l.Spec.AcquireTime.UTC().Format(time.RFC3339Nano)
	}
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	return holder + "@" + renewed
}

// WithoutLockstepd is the verdict on a COLO secondary that runs (v) on a node where lockstepd
// does not (Lockstepd): suspect from when its lease ran out, lost after grace; lost at once on a
// node where lockstepd never published its address. Any other verdict stands.
func WithoutLockstepd(v Verdict, nodeName string, expired, now time.Time, grace time.Duration) Verdict {
	if v.State != Running {
		return v
	}
	if expired.IsZero() {
		return Verdict{State: Lost, Reason: ReasonLockstepdNotRunning, Since: now,
			Message: fmt.Sprintf("lockstepd does not run on node %s (no %s annotation): a COLO secondary holds the VM only through it", nodeName, ftv1.AnnotationNodeLoggingAddress)}
	}
	since := expired
	down := now.Sub(since)
	if down >= grace {
		return Verdict{State: Lost, Reason: ReasonLockstepdNotRunning, Since: since,
			Message: fmt.Sprintf("lockstepd has not run on node %s since %s (grace %s): a COLO secondary holds the VM only through it", nodeName, since.UTC().Format(time.RFC3339), grace)}
	}
	return Verdict{State: Suspect, Reason: ReasonLockstepdNotRunning, Since: since, RecheckAfter: grace - down,
		Message: fmt.Sprintf("lockstepd has not run on node %s since %s (its node lease ran out); the secondary is lost after %s", nodeName, since.UTC().Format(time.RFC3339), grace)}
}
