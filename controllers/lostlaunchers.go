package controllers

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/health"
	"github.com/lockstep-dev/lockstep/internal/term"
)

// +kubebuilder:rbac:groups="",resources=pods,verbs=delete

// KubeVirt finishes a deleted VMI only once its launcher pod is gone (virt-api's mutator gives
// every VMI a finalizer that virt-controller removes then), and on a lost node no kubelet ends the
// pod: the member's VMI would stay, terminating, until the node came back or someone remediated
// it, and with it a FaultTolerantVM's deletion. The pair's record already proves what node
// remediation would: once another member holds it, or its term has passed since the last renewal
// the operator saw, nothing of a member on a lost node runs the VM (it paused itself when it could
// no longer renew). The operator then deletes that member's launcher pod at once, as a node
// remediator deletes the pods of a node it fenced, and KubeVirt finishes the VMI.

// releaseLostLaunchers releases the launcher pods of the pair's members that are being deleted on
// lost nodes (releaseLostLauncher).
func (r *FaultTolerantVMReconciler) phaseReleaseLostLaunchers(ctx context.Context, s *scope) error {
	for _, mv := range s.gone {
		wait, err := r.releaseLostLauncher(ctx, s.ftvm, mv, s.record)
		if err != nil {
			return err
		}
		s.requeueWithin(wait)
	}
	return nil
}

// releaseLostLauncher deletes at once the launcher pods of mv, a member being deleted, where
// launcherReleasable allows it. It returns how long to wait before looking again (0: nothing to
// wait for).
func (r *FaultTolerantVMReconciler) releaseLostLauncher(ctx context.Context, ftvm *ftv1.FaultTolerantVM, mv *memberView, rec *record) (time.Duration, error) {
	if mv.vmi.DeletionTimestamp == nil {
		return 0, nil
	}
	var node corev1.Node
	nodePtr := &node
	if err := r.Get(ctx, types.NamespacedName{Name: mv.node}, &node); apierrors.IsNotFound(err) {
		nodePtr = nil
	} else if err != nil {
		return 0, err
	}
	now := r.Clock.Now()
	nodeVerdict := health.JudgeNode(mv.node, nodePtr, now, r.Config.NodeLostGrace)
	termLeft := time.Duration(0)
	holder := ""
	if rec != nil && rec.lease != nil {
		holder = rec.Holder
		// A record that no lockstepd ever renewed with a term has no term to wait out (termLeft).
		if rec.lease.Spec.LeaseDurationSeconds != nil {
			termLeft = term.Of(rec.lease.Spec.LeaseDurationSeconds).ExpiresIn(recordRenewalSeen(r.Sightings, rec.lease, now), now)
		}
	}
	ok, wait := launcherReleasable(mv.vmi.Name, nodeVerdict, holder, termLeft)
	if !ok {
		return wait, nil
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(mv.vmi.Namespace), client.MatchingLabels{virtv1.CreatedByLabel: string(mv.vmi.UID)}); err != nil {
		return 0, err
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if err := r.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: &pod.UID}); client.IgnoreNotFound(err) != nil {
			return 0, fmt.Errorf("deleting the launcher pod %s of member %s: %w", pod.Name, mv.vmi.Name, err)
		}
		log.FromContext(ctx).Info("deleted the launcher pod of a member on a lost node", "pod", pod.Name, "vmi", mv.vmi.Name, "node", mv.node)
		r.Recorder.Eventf(ftvm, mv.vmi, corev1.EventTypeNormal, ftv1.ReasonLauncherReleased, "Release",
			"deleted launcher pod %s of %s at once: %s, and %s", pod.Name, mv.vmi.Name, nodeVerdict.Message, releaseProof(holder, mv.vmi.Name))
	}
	return 0, nil
}

// launcherReleasable says whether the launcher pod of member, which is being deleted, may be
// deleted at once: its node is lost (nodeVerdict), and the pair's record shows that nothing of it
// runs the VM: another member holds the record (its claim came after member's term), or nobody
// does and termLeft, what remains of the term since the last renewal seen, is zero. Where it
// may not yet, wait is when to look again (0: only a change will tell).
func launcherReleasable(member string, nodeVerdict health.Verdict, holder string, termLeft time.Duration) (ok bool, wait time.Duration) {
	switch {
	case nodeVerdict.State == health.Suspect:
		return false, nodeVerdict.RecheckAfter
	case nodeVerdict.State != health.Lost:
		return false, 0 // its kubelet ends the pod
	case holder == member:
		return false, 0 // the record still names it: the operator moves the record first
	case holder != "":
		return true, 0
	case termLeft > 0:
		return false, termLeft
	}
	return true, 0
}

// releaseProof says, for the event, why nothing of member runs the VM.
func releaseProof(holder, member string) string {
	if holder != "" && holder != member {
		return fmt.Sprintf("%s holds the pair's record", holder)
	}
	return "the pair's record has had no holder for a whole term"
}
