package kubevirt_test

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
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
// KubeVirt's own virt-controller. A running member is deleted on a node whose virt-handler stopped
// answering (its heartbeat older than virt-controller's 5 minutes): virt-controller deletes the
// launcher pod, which, with no kubelet to end it, stays terminating, and the VMI with it:
// virt-controller's node controller fails only the VMIs of an unresponsive node that have no pod
// left. Once the pod is deleted at once, as the operator does, KubeVirt fails the VMI
// (NodeUnresponsive), removes its finalizer, and the VMI is gone.
func TestKubeVirtFinishesAMemberOnALostNodeOnlyOnceItsLauncherPodIsGone(t *testing.T) {
	ctx := context.Background()
	const lost = "lost-node"
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: lost,
		Labels: map[string]string{virtv1.NodeSchedulable: "true"},
		// virt-handler's last heartbeat: ten minutes ago.
		Annotations: map[string]string{virtv1.VirtHandlerHeartbeat: time.Now().Add(-10 * time.Minute).UTC().Format(time.RFC3339)}}}
	if err := k8s.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, node) })
	// virt-controller looks for virt-handler's DaemonSet before it fails a node's VMIs.
	handlers := virtHandlerDaemonSet()
	if err := k8s.Create(ctx, handlers); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, handlers) })

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
	// virt-controller's node controller judged the node: it marks it unschedulable first.
	waitFor(t, "virt-controller marking the lost node unschedulable", func() bool {
		cur := &corev1.Node{}
		return k8s.Get(ctx, client.ObjectKeyFromObject(node), cur) == nil && cur.Labels[virtv1.NodeSchedulable] == "false"
	})
	time.Sleep(5 * time.Second) // its next looks (each VMI change brings one)
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

// virtHandlerDaemonSet is virt-handler's DaemonSet as virt-controller finds it (by its label).
func virtHandlerDaemonSet() *appsv1.DaemonSet {
	labels := map[string]string{virtv1.AppLabel: "virt-handler"}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: kubevirtNamespace, Name: "virt-handler", Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "virt-handler", Image: "quay.io/kubevirt/virt-handler:v1.9.0"}}},
			},
		},
	}
}

// waitFor waits up to two minutes (virt-controller's node controller looks again every minute)
// for what, failing with virt-controller's last lines.
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
