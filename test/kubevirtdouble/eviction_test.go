package kubevirtdouble

import (
	"context"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// TestEvictionInterceptorEvacuatesAsVirtAPIDoes: the launcher pod of a VMI with an evacuating
// eviction strategy is refused with 429 and its VMI marked for evacuation from the pod's node,
// once; a dry run is refused without the mark; other pods, and a VMI without such a strategy,
// are evicted.
func TestEvictionInterceptorEvacuatesAsVirtAPIDoes(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = corev1.AddToScheme(scheme)
	_ = virtv1.AddToScheme(scheme)
	vmi := func(name string, s *virtv1.EvictionStrategy) *virtv1.VirtualMachineInstance {
		return &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name + "-uid")},
			Spec: virtv1.VirtualMachineInstanceSpec{EvictionStrategy: s}}
	}
	launcher := func(v *virtv1.VirtualMachineInstance) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: LauncherPodName(v.Name),
			Labels:          map[string]string{"kubevirt.io": launcherApp},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: v.Name, UID: v.UID, Controller: ptr.To(true)}}},
			Spec: corev1.PodSpec{NodeName: "node-2"}}
	}
	member, plain := vmi("vm-2", ptr.To(virtv1.EvictionStrategyExternal)), vmi("plain", nil)
	other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(member, plain, launcher(member), launcher(plain), other).Build()
	e := &EvictionInterceptor{Client: c}
	evict := func(pod string, dryRun bool) admission.Response {
		return e.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Namespace: "ns", Name: pod, SubResource: "eviction", Operation: admissionv1.Create, DryRun: &dryRun}})
	}
	marked := func() string {
		got := &virtv1.VirtualMachineInstance{}
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "vm-2"}, got); err != nil {
			t.Fatal(err)
		}
		return got.Status.EvacuationNodeName
	}

	r := evict("virt-launcher-vm-2", true)
	if r.Allowed || r.Result.Code != http.StatusTooManyRequests || marked() != "" {
		t.Fatalf("dry run: allowed %v, %+v, marked %q", r.Allowed, r.Result, marked())
	}
	r = evict("virt-launcher-vm-2", false)
	if r.Allowed || r.Result.Code != http.StatusTooManyRequests || r.Result.Message != `Eviction triggered evacuation of VMI "ns/vm-2"` || marked() != "node-2" {
		t.Fatalf("eviction: allowed %v, %+v, marked %q", r.Allowed, r.Result, marked())
	}
	r = evict("virt-launcher-vm-2", false)
	if r.Allowed || !strings.HasPrefix(r.Result.Message, "Evacuation in progress") {
		t.Fatalf("again: allowed %v, %+v", r.Allowed, r.Result)
	}
	for _, pod := range []string{"virt-launcher-plain", "web", "gone"} {
		if r := evict(pod, false); !r.Allowed {
			t.Errorf("%s: refused: %+v", pod, r.Result)
		}
	}
}
