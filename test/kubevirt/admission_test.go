package kubevirt_test

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/member"
	"github.com/lockstep-dev/lockstep/test/kubevirtcontrol"
)

// virt-api's own admission, in front of every VMI lockstep creates: its VMI mutator and validator,
// its Plugin validator, and the eviction interceptor by which a drain reaches lockstep.

// chartCOLO is how the operator builds members with the chart's defaults: COLO, the hook as each
// member's sidecar (the Sidecar feature gate) in the operator's image.
var chartCOLO = member.COLO{Enabled: true, HookSidecarImage: "registry.example/lockstep-operator:test"}

// TestVirtAPIAdmitsMembersAsLockstepBuildsThemAndKeepsWhatLockstepSet: the members of the
// project's sample FaultTolerantVM (config/samples), as the operator builds them with the chart's
// defaults (COLO, the hook as each member's sidecar), pass virt-api's VMI validator, and its
// mutator, which defaults what the template leaves out, changes nothing lockstep set: the labels
// and annotations its controllers and lockstepd read, the resources placement counted, the CPU
// topology and guest memory without room to hot-plug into, the eviction strategy a drain
// depends on, the guest's hostname.
func TestVirtAPIAdmitsMembersAsLockstepBuildsThemAndKeepsWhatLockstepSet(t *testing.T) {
	ctx := context.Background()
	sample := sampleFaultTolerantVM(t)
	// The sample with two sockets and 3Gi, whose room to hot-plug KubeVirt would make 8 sockets
	// and 12Gi.
	sockets := sample.DeepCopy()
	sockets.Name, sockets.UID = "sockets", "sockets-uid"
	guest := resource.MustParse("3Gi")
	sockets.Spec.Template.Spec.Domain.CPU, sockets.Spec.Template.Spec.Domain.Memory.Guest = &virtv1.CPU{Sockets: 2, Cores: 1}, &guest
	for _, c := range []struct {
		ftvm *ftv1.FaultTolerantVM
		role string
	}{{sample, ftv1.RolePrimary}, {sample, ftv1.RoleSecondary}, {sockets, ftv1.RolePrimary}} {
		t.Run(c.ftvm.Name+" "+c.role, func(t *testing.T) {
			built := buildMember(t, c.ftvm, c.role, chartCOLO)
			sent := built.DeepCopy()
			create(t, built)
			got := &virtv1.VirtualMachineInstance{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(built), got); err != nil {
				t.Fatal(err)
			}
			if got.Spec.Architecture == "" {
				t.Errorf("virt-api's mutator did not run: no architecture")
			}
			for k, v := range sent.Labels {
				if got.Labels[k] != v {
					t.Errorf("label %s: sent %q, virt-api kept %q", k, v, got.Labels[k])
				}
			}
			for k, v := range sent.Annotations {
				if got.Annotations[k] != v {
					t.Errorf("annotation %s: sent %q, virt-api kept %q", k, v, got.Annotations[k])
				}
			}
			if !reflect.DeepEqual(got.Spec.Domain.Resources, sent.Spec.Domain.Resources) {
				t.Errorf("resources: sent %+v, virt-api kept %+v", sent.Spec.Domain.Resources, got.Spec.Domain.Resources)
			}
			// No room to hot-plug into (member.noHotplug): KubeVirt would add four times the guest's
			// memory and sockets.
			if !reflect.DeepEqual(got.Spec.Domain.Memory, sent.Spec.Domain.Memory) {
				t.Errorf("memory: sent %+v, virt-api made it %+v", sent.Spec.Domain.Memory, got.Spec.Domain.Memory)
			}
			gc, sc := got.Spec.Domain.CPU, sent.Spec.Domain.CPU
			if gc == nil || gc.Cores != sc.Cores || gc.Sockets != sc.Sockets || gc.Threads != sc.Threads || gc.MaxSockets != sc.MaxSockets {
				t.Errorf("CPU topology: sent %+v, virt-api made it %+v", sc, gc)
			}
			// A model lockstep did not name (the operator's --colo-cpu-model unset) is KubeVirt's
			// default, host-model: the same CPU on both members only on alike nodes (docs/kubevirt.md).
			if want := cmp.Or(sc.Model, virtv1.CPUModeHostModel); gc.Model != want {
				t.Errorf("CPU model: sent %q, virt-api made it %q, want %q", sc.Model, gc.Model, want)
			}
			if got.Spec.EvictionStrategy == nil || *got.Spec.EvictionStrategy != *sent.Spec.EvictionStrategy {
				t.Errorf("eviction strategy: sent %v, virt-api kept %v", *sent.Spec.EvictionStrategy, got.Spec.EvictionStrategy)
			}
			if got.Spec.Hostname != sent.Spec.Hostname || got.Spec.PriorityClassName != sent.Spec.PriorityClassName {
				t.Errorf("hostname %q, priority class %q: virt-api kept %q, %q", sent.Spec.Hostname, sent.Spec.PriorityClassName, got.Spec.Hostname, got.Spec.PriorityClassName)
			}
		})
	}
}

// TestVirtAPIsEvictionInterceptorTurnsAMembersDrainIntoAnEvacuation: what lockstep's drain
// handling (controllers/evacuation.go) and the KubeVirt double's interceptor assume of virt-api's,
// checked against it. Evicting a running member's launcher pod is refused with 429 (kubectl drain
// retries), and the member's status.evacuationNodeName names the pod's node, for lockstep to move
// it; a second eviction is refused while the evacuation is under way; a dry-run eviction is
// refused and marks nothing.
func TestVirtAPIsEvictionInterceptorTurnsAMembersDrainIntoAnEvacuation(t *testing.T) {
	ctx := context.Background()
	ftvm := sampleFaultTolerantVM(t)
	ftvm.Name, ftvm.UID = "drained", "drained-uid"
	m := buildMember(t, ftvm, ftv1.RolePrimary, chartCOLO)
	create(t, m)
	pod := runLauncher(t, m, "node-1")

	dry := evict(t, pod, metav1.DryRunAll)
	if !apierrors.IsTooManyRequests(dry) || !isWebhookDenial(dry, "virt-launcher-eviction-interceptor.kubevirt.io") {
		t.Fatalf("a dry-run eviction of a member's launcher: %v; want virt-api's interceptor to refuse it with 429", dry)
	}
	if got := vmiOf(t, m); got.Status.EvacuationNodeName != "" {
		t.Fatalf("a dry-run eviction marked the member for evacuation from %s", got.Status.EvacuationNodeName)
	}

	err := evict(t, pod)
	if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), `Eviction triggered evacuation of VMI "`+ns+`/`+m.Name+`"`) {
		t.Fatalf("evicting a member's launcher: %v; want 429 and the evacuation", err)
	}
	if got := vmiOf(t, m); got.Status.EvacuationNodeName != "node-1" {
		t.Fatalf("after the eviction the member's evacuationNodeName is %q, want node-1", got.Status.EvacuationNodeName)
	}
	again := evict(t, pod)
	if !apierrors.IsTooManyRequests(again) || !strings.Contains(again.Error(), "Evacuation in progress") {
		t.Fatalf("evicting it again: %v; want 429 while the evacuation is under way", again)
	}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{}); err != nil {
		t.Fatalf("the launcher pod after the refused evictions: %v", err)
	}
}

// TestVirtAPIAdmitsLockstepsPlugin: the Plugin in config/kubevirt-plugin passes virt-api's Plugin
// validator, which compiles its CEL condition as virt-launcher will evaluate it; the condition
// written against the VMI's JSON names instead is refused, so the acceptance means something.
func TestVirtAPIAdmitsLockstepsPlugin(t *testing.T) {
	ctx := context.Background()
	objs, err := readObjects(filepath.Join(root, "config", "kubevirt-plugin", "plugin.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range objs {
		if u.GetKind() != "Plugin" {
			continue
		}
		wrong := u.DeepCopy()
		wrong.SetName(u.GetName() + "-json-names")
		if err := unstructured.SetNestedField(wrong.Object, "'ft.lockstep.dev/pair' in vmi.metadata.labels", "spec", "condition"); err != nil {
			t.Fatal(err)
		}
		if err := k8s.Create(ctx, wrong); !isWebhookDenial(err, "plugin-validator.plugin.kubevirt.io") {
			t.Fatalf("a Plugin whose condition names vmi.metadata.labels: %v; want virt-api to refuse it", err)
		}
		if err := k8s.Create(ctx, u); err != nil {
			t.Fatalf("lockstep's Plugin: %v", err)
		}
		return
	}
	t.Fatal("config/kubevirt-plugin/plugin.yaml has no Plugin")
}

// sampleFaultTolerantVM is the project's sample FaultTolerantVM (config/samples), in the test's
// namespace.
func sampleFaultTolerantVM(t *testing.T) *ftv1.FaultTolerantVM {
	t.Helper()
	objs, err := readObjects(filepath.Join(root, "config", "samples", "ft_v1alpha1_faulttolerantvm.yaml"))
	if err != nil || len(objs) != 1 {
		t.Fatalf("the sample FaultTolerantVM: %v (%d objects)", err, len(objs))
	}
	data, err := objs[0].MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	ftvm := &ftv1.FaultTolerantVM{}
	if err := yaml.Unmarshal(data, ftvm); err != nil {
		t.Fatal(err)
	}
	ftvm.Namespace, ftvm.UID = ns, types.UID(ftvm.Name+"-uid")
	return ftvm
}

// buildMember is ftvm's member of role as the operator builds it (member.Build), its claims
// created.
func buildMember(t *testing.T, ftvm *ftv1.FaultTolerantVM, role string, colo member.COLO) *virtv1.VirtualMachineInstance {
	t.Helper()
	ordinal := 1
	if role == ftv1.RoleSecondary {
		ordinal = 2
	}
	m := member.Member{Ordinal: ordinal, Role: role, Node: fmt.Sprint("node-", ordinal), Claims: map[string]string{},
		DiskSizes: map[string]resource.Quantity{}, DiskBytes: member.DiskBytes{}, Since: time.Now()}
	for _, v := range ftvm.Spec.Template.Spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		claim := v.PersistentVolumeClaim.ClaimName
		if role == ftv1.RoleSecondary {
			claim = ftvm.Name + "-2-" + v.Name // a copy of its own
		}
		m.Claims[v.Name], m.DiskSizes[v.Name], m.DiskBytes[v.Name] = claim, resource.MustParse("1Gi"), 1<<30
		ensureClaim(t, claim)
	}
	vmi, err := member.Build(ftvm, member.Normalize(ftvm.UID, ftvm.Spec.Template), m, member.Options{COLO: colo})
	if err != nil {
		t.Fatal(err)
	}
	return vmi
}

// runLauncher waits for the launcher pod of vmi, binds it to node and reports it running and
// ready, as the scheduler and a kubelet would; virt-controller then hands the VMI over to the
// node (status.nodeName), which the test waits for.
func runLauncher(t *testing.T, vmi *virtv1.VirtualMachineInstance, node string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	pod := launcherOf(t, vmi)
	if err := k8s.SubResource("binding").Create(ctx, pod, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name},
		Target: corev1.ObjectReference{Kind: "Node", Name: node}}); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	pod.Status.Phase, pod.Status.QOSClass = corev1.PodRunning, corev1.PodQOSGuaranteed
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}
	pod.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, Image: c.Image, Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}})
	}
	if err := k8s.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for vmiOf(t, vmi).Status.NodeName != node {
		if time.Now().After(deadline) {
			t.Fatalf("virt-controller did not hand %s over to %s in 60 s: %+v\nvirt-controller's last lines:\n%s", vmi.Name, node, vmiOf(t, vmi).Status, kubevirtcontrol.Tail(controllerLog, 20))
		}
		time.Sleep(200 * time.Millisecond)
	}
	return pod
}

// evict asks the API server to evict pod, as kubectl drain does.
func evict(t *testing.T, pod *corev1.Pod, dryRun ...string) error {
	t.Helper()
	return k8s.SubResource("eviction").Create(context.Background(), pod, &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		DeleteOptions: &metav1.DeleteOptions{DryRun: dryRun}})
}

func vmiOf(t *testing.T, vmi *virtv1.VirtualMachineInstance) *virtv1.VirtualMachineInstance {
	t.Helper()
	got := &virtv1.VirtualMachineInstance{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(vmi), got); err != nil {
		t.Fatal(err)
	}
	return got
}
