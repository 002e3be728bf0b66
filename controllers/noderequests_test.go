package controllers

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/lockstep-dev/lockstep/internal/placement"
)

// TestNodeRequestsFollowThePods: what a node's pods request follows their events, as the
// scheduler counts it (init containers, overhead), and a launcher pod marks its VMI as counted.
func TestNodeRequestsFollowThePods(t *testing.T) {
	r := &NodeRequests{pods: map[types.UID]boundPod{}, byNode: map[string]placement.Resources{}, launchers: map[types.UID]int{}}
	req := func(cpu, memory string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory)}}
	}
	pod := func(uid, node string, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Name: uid},
			Spec: corev1.PodSpec{NodeName: node,
				Containers:     []corev1.Container{{Name: "a", Resources: req("500m", "1Gi")}, {Name: "b", Resources: req("250m", "256Mi")}},
				InitContainers: []corev1.Container{{Name: "init", Resources: req("2", "512Mi")}},
				Overhead:       corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}},
			Status: corev1.PodStatus{Phase: phase},
		}
	}
	const mi = int64(1) << 20
	want := func(node string, cpu, memory int64) {
		t.Helper()
		if got := r.Requested(node); got != (placement.Resources{MilliCPU: cpu, MemoryBytes: memory}) {
			t.Fatalf("%s: requested %+v, want %dm and %d MiB", node, got, cpu, memory/mi)
		}
	}
	// An init container runs before the others: the pod asks for the larger of it and their sum.
	a := pod("a", "n1", corev1.PodRunning)
	r.set(a)
	want("n1", 2000, (1024+256+64)*mi)
	launcher := pod("l", "n1", corev1.PodPending)
	launcher.Spec.InitContainers = nil
	launcher.Labels = map[string]string{launcherCreatedBy: "vmi-uid"}
	r.set(launcher)
	want("n1", 2750, (1024+256+64+1024+256+64)*mi)
	if !r.LauncherBound("vmi-uid") {
		t.Fatal("the launcher's VMI is not counted through its pod")
	}
	// Updated in place (no double count); ended; moved nowhere; deleted through a tombstone.
	r.set(a)
	want("n1", 2750, (1024+256+64+1024+256+64)*mi)
	r.set(pod("a", "n1", corev1.PodSucceeded))
	want("n1", 750, (1024+256+64)*mi)
	r.forget(toolscache.DeletedFinalStateUnknown{Key: "ns/l", Obj: launcher})
	want("n1", 0, 0)
	if r.LauncherBound("vmi-uid") || len(r.byNode) != 0 || len(r.pods) != 0 {
		t.Fatalf("left behind: %+v %+v %+v", r.launchers, r.byNode, r.pods)
	}
	// A pod that is not bound asks nothing of any node.
	r.set(pod("u", "", corev1.PodPending))
	if len(r.byNode) != 0 {
		t.Fatalf("an unbound pod counted: %+v", r.byNode)
	}
}

// TestTrimPodKeepsWhatIsCounted: the cache's cut pod asks for what the whole pod does.
func TestTrimPodKeepsWhatIsCounted(t *testing.T) {
	full := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: "u", Name: "p", Namespace: "ns", Labels: map[string]string{launcherCreatedBy: "v", "app": "x"},
			Annotations: map[string]string{"big": "annotation"}},
		Spec: corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "c", Image: "img", Args: []string{"--x"},
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}},
			InitContainers: []corev1.Container{{Name: "side", RestartPolicy: ptrTo(corev1.ContainerRestartPolicyAlways),
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	out, err := trimPod(full)
	if err != nil {
		t.Fatal(err)
	}
	cut := out.(*corev1.Pod)
	r := &NodeRequests{pods: map[types.UID]boundPod{}, byNode: map[string]placement.Resources{}, launchers: map[types.UID]int{}}
	r.set(cut)
	// A sidecar (an init container that keeps running) adds to the others.
	if got := r.Requested("n").MilliCPU; got != 2000 {
		t.Fatalf("the cut pod asks for %dm CPU, the whole one 2000m", got)
	}
	if !r.LauncherBound("v") || cut.Annotations != nil || cut.Labels["app"] != "" || cut.Spec.Containers[0].Image != "" {
		t.Fatalf("cut: %+v", cut)
	}
}

func ptrTo[T any](v T) *T { return &v }
