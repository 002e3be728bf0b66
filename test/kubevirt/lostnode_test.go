package kubevirt_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/test/kubevirtcontrol"
)

// TestKubeVirtFinishesAMemberOnALostNodeOnlyOnceItsLauncherPodIsGone: what the operator's release
// of a lost member's launcher pod (controllers/lostlaunchers.go) relies on, checked against
// KubeVirt's own virt-controller. A running member is deleted on a node that died moments ago
// (its virt-handler's last heartbeat 30 s old): virt-controller deletes the launcher pod, which,
// with no kubelet to end it, stays terminating, and the VMI with it. Once the pod is deleted at
// once, as the operator does, virt-controller fails the VMI (running, and its pod gone), removes
// its finalizer, and the VMI is gone. (Run by hand without that deletion, and with the heartbeat
// past virt-controller's 5-minute limit, the VMI was still there two minutes later: its node
// controller, too, fails only the VMIs whose pod is gone.)
func TestKubeVirtFinishesAMemberOnALostNodeOnlyOnceItsLauncherPodIsGone(t *testing.T) {
	ctx := context.Background()
	const lost = "lost-node"
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: lost,
		Labels: map[string]string{virtv1.NodeSchedulable: "true"},
		// virt-handler's last heartbeat, just before its node died.
		Annotations: map[string]string{virtv1.VirtHandlerHeartbeat: time.Now().Add(-30 * time.Second).UTC().Format(time.RFC3339)}}}
	if err := k8s.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, node) })

	ftvm := sampleFaultTolerantVM(t)
	ftvm.Name, ftvm.UID = "lost", "lost-uid"
	m := buildMember(t, ftvm, ftv1.RolePrimary, chartCOLO)
	create(t, m)
	pod := runLauncher(t, m, lost)
	// virt-handler's report, before its node was lost: the VM runs.
	running := vmiOf(t, m)
	base := running.DeepCopy()
	running.Status.Phase = virtv1.Running
	if err := asKubeVirt.Patch(ctx, running, client.MergeFrom(base)); err != nil { // (a VMI has no status subresource)
		t.Fatal(err)
	}
	waitFor(t, "the member Running", func() bool { return vmiOf(t, m).Status.Phase == virtv1.Running })

	if err := k8s.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "virt-controller deleting the member's launcher pod", func() bool {
		cur := &corev1.Pod{}
		return k8s.Get(ctx, client.ObjectKeyFromObject(pod), cur) == nil && cur.DeletionTimestamp != nil
	})
	time.Sleep(5 * time.Second) // its next syncs (the pod's deletion brought one)
	if cur := vmiOf(t, m); cur.IsFinal() {
		t.Fatalf("KubeVirt finished a member whose launcher pod still lives on its lost node: %s, %s", cur.Status.Phase, cur.Status.Reason)
	}

	// What the operator does once the pair's record proves the member stopped.
	if err := k8s.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "KubeVirt finishing the member once its launcher pod is gone", func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(m), &virtv1.VirtualMachineInstance{}))
	})
}

// waitFor waits up to two minutes for what, failing with virt-controller's last lines.
func waitFor(t *testing.T, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not in two minutes\nvirt-controller's last lines:\n%s", what, kubevirtcontrol.Tail(controllerLog, 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
