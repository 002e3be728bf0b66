package kubevirtdouble

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/lockstep-dev/lockstep/internal/kubevirtsize"
)

func TestMirrorReportsWhatKubeVirtWould(t *testing.T) {
	now := metav1.Now()
	for _, c := range []struct {
		name   string
		pod    *corev1.Pod
		phase  virtv1.VirtualMachineInstancePhase
		ready  corev1.ConditionStatus
		reason string
	}{
		{"gone", nil, virtv1.Failed, corev1.ConditionFalse, virtv1.PodNotExistsReason},
		{"unscheduled", &corev1.Pod{}, virtv1.Scheduling, corev1.ConditionFalse, "GuestNotRunning"},
		{"bound", &corev1.Pod{Spec: corev1.PodSpec{NodeName: "n1"}}, virtv1.Scheduled, corev1.ConditionFalse, "PodNotReady"},
		{"running", &corev1.Pod{Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}, virtv1.Running, corev1.ConditionTrue, ""},
		{"terminating", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}, Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}},
			virtv1.Running, corev1.ConditionFalse, virtv1.PodTerminatingReason},
		{"failed", &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed}}, virtv1.Failed, corev1.ConditionFalse, "PodFailed"},
	} {
		phase, ready := Mirror(c.pod)
		if phase != c.phase || ready.Type != virtv1.VirtualMachineInstanceReady || ready.Status != c.ready || ready.Reason != c.reason {
			t.Errorf("%s: got %s, %s/%s; want %s, %s/%s", c.name, phase, ready.Status, ready.Reason, c.phase, c.ready, c.reason)
		}
	}
}

func TestLauncherPodCarriesWhatTheSchedulerNeeds(t *testing.T) {
	guest := resource.MustParse("1Gi")
	vmi := &virtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db-1", UID: "u1", Labels: map[string]string{"ft.lockstep.dev/pair": "db"}},
		Spec: virtv1.VirtualMachineInstanceSpec{
			Domain: virtv1.DomainSpec{
				Memory: &virtv1.Memory{Guest: &guest},
				Resources: virtv1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
					Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("1Gi")},
				},
			},
			NodeSelector:      map[string]string{"zone": "a"},
			Tolerations:       []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists}},
			PriorityClassName: "lockstep-ft",
			Affinity:          &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{}},
		},
	}
	pod, err := LauncherPod(vmi, "img", kubevirtsize.Cluster{})
	if err != nil {
		t.Fatal(err)
	}
	req := pod.Spec.Containers[0].Resources.Requests
	// KubeVirt v1.9's overhead: no memory request to count page tables of; 220Mi for its
	// processes, 8Mi for each of 2 vCPUs, 8Mi for the IO thread, 32Mi of video RAM, 100Mi for
	// Guaranteed QoS (a memory limit alone, CPU request equal to its limit).
	wantMem := resource.MustParse("1400Mi")
	if req.Cpu().String() != "2" || req.Memory().Cmp(wantMem) != 0 {
		t.Errorf("requests %v, want 2 CPUs and %s", req, wantMem.String())
	}
	if lim := pod.Spec.Containers[0].Resources.Limits; lim.Memory().Cmp(wantMem) != 0 {
		t.Errorf("memory limit %s, want %s", lim.Memory(), wantMem.String())
	}
	if got := pod.Annotations[virtv1.MemoryOverheadAnnotationBytes]; got != fmt.Sprint(376<<20) {
		t.Errorf("the overhead annotation says %s, want %d (1400Mi less the guest's 1Gi)", got, 376<<20)
	}
	if pod.Spec.NodeSelector["zone"] != "a" || len(pod.Spec.Tolerations) != 1 || pod.Spec.PriorityClassName != "lockstep-ft" || pod.Spec.Affinity.PodAntiAffinity == nil {
		t.Errorf("scheduling constraints not carried over: %+v", pod.Spec)
	}
	// Pod anti-affinity between members selects the launcher pods by the VMI's labels.
	if pod.Labels["ft.lockstep.dev/pair"] != "db" || pod.Labels[LabelCreatedBy] != "u1" || pod.Name != "virt-launcher-db-1" {
		t.Errorf("labels/name: %s %v", pod.Name, pod.Labels)
	}
	vmi.Spec.Domain.Memory = nil
	vmi.Spec.Domain.Resources.Requests = nil
	delete(vmi.Spec.Domain.Resources.Limits, corev1.ResourceMemory)
	if _, err := LauncherPod(vmi, "img", kubevirtsize.Cluster{}); err == nil {
		t.Error("a VMI without memory must be refused")
	}
}

// A member whose launcher pod was bound before its node's host was up is looked at again until
// the host is up: nothing else would bring it back (a VM applied right after the local cluster's
// `up` stayed Scheduling for good).
func TestAMemberWhoseHostIsNotUpYetIsLookedAtAgain(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, virtv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	vmi := &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm-1", UID: "u1",
		Labels: map[string]string{"ft.lockstep.dev/pair": "vm"}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: LauncherPodName("vm-1"), Labels: map[string]string{LabelCreatedBy: "u1"}},
		Spec: corev1.PodSpec{NodeName: "node-1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(vmi, pod).Build()
	l := &Launcher{Client: c, Domains: &Domains{Hosts: &Hosts{}}}
	res, err := l.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "vm-1"}})
	if err != nil || res.RequeueAfter <= 0 {
		t.Fatalf("got %+v, %v; want a requeue while node-1's host is down", res, err)
	}
}
