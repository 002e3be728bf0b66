//go:build linux

package dataplane

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/ext"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	virtv1 "kubevirt.io/api/core/v1"
	"libvirt.org/go/libvirtxml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/kubevirthook"
	"github.com/lockstep-dev/lockstep/test/apitest"
)

// TestLauncherPodsOfMembersGetTheirDirectoryQEMUAndHook applies config/kubevirt and
// config/kubevirt-plugin to the real API server and creates launcher pods as KubeVirt would: a
// member's gets the node's member directory at the same path in its compute container,
// lockstep's QEMU image read-only where the hook names the emulator, and the hook as the Plugin's
// sidecar (with equal requests and limits, so the pod keeps its Guaranteed QoS); a plain VM's
// launcher pod is left as it is. The Plugin resource validates against KubeVirt v1.9's schema.
func TestLauncherPodsOfMembersGetTheirDirectoryQEMUAndHook(t *testing.T) {
	ctx := context.Background()
	for _, k := range []string{"kubevirt", "kubevirt-plugin"} {
		apitest.ApplyKustomization(t, k8s, filepath.Join(root, "config", k))
	}
	plugin := &unstructured.Unstructured{}
	plugin.SetGroupVersionKind(schema.GroupVersionKind{Group: "plugin.kubevirt.io", Version: "v1alpha1", Kind: "Plugin"})
	if err := k8s.Get(ctx, client.ObjectKey{Name: "lockstep"}, plugin); err != nil {
		t.Fatalf("the Plugin: %v", err)
	}
	condition, _, _ := unstructured.NestedString(plugin.Object, "spec", "condition")
	member := &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm-1", Labels: map[string]string{ftv1.LabelPair: "vm"}}}
	for _, c := range []struct {
		what string
		vmi  *virtv1.VirtualMachineInstance
		want bool
	}{
		{"a member", member, true},
		{"a plain VM with labels", &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"app": "web"}}}, false},
		{"a plain VM without labels", &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "db"}}, false},
	} {
		got, err := pluginCondition(condition, c.vmi)
		if err != nil || got != c.want {
			t.Errorf("the Plugin's condition %q on %s: %v, %v; want %v without an error (an error fails the VMI)", condition, c.what, got, err, c.want)
		}
	}
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "launchers"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	uid := "0c4e2f1a-5b6c-4d7e-8f90-a1b2c3d4e5f6"
	launcher := func(member bool) *corev1.Pod {
		labels := map[string]string{"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": uid}
		if member {
			labels[ftv1.LabelPair] = "vm"
		}
		res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "launchers", GenerateName: "virt-launcher-vm-", Labels: labels},
			Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "compute", Image: "virt-launcher", Resources: corev1.ResourceRequirements{Requests: res, Limits: res}}},
				Volumes:    []corev1.Volume{{Name: "kubevirt-plugin-sockets", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			}}
	}
	// The policies take a moment to be in force after they are created.
	var pod *corev1.Pod
	deadline := time.Now().Add(30 * time.Second)
	for {
		pod = launcher(true)
		if err := k8s.Create(ctx, pod, client.DryRunAll); err != nil {
			t.Fatal(err)
		}
		if len(pod.Spec.Containers) > 1 && len(pod.Spec.Volumes) > 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a member's launcher pod was not mutated 30 s after the policies were created: %+v", pod.Spec)
		}
		time.Sleep(200 * time.Millisecond)
	}

	dir := "/var/run/lockstep/" + uid
	var hostPath *corev1.HostPathVolumeSource
	var qemu *corev1.ImageVolumeSource
	for _, v := range pod.Spec.Volumes {
		switch v.Name {
		case "lockstep-member":
			hostPath = v.HostPath
		case "lockstep-qemu":
			qemu = v.Image
		}
	}
	if hostPath == nil || hostPath.Path != dir || hostPath.Type == nil || *hostPath.Type != corev1.HostPathDirectory {
		t.Errorf("the member directory volume: %+v", hostPath)
	}
	if qemu == nil || qemu.Reference != "ghcr.io/lockstep-dev/lockstep-qemu:dev" || qemu.PullPolicy != corev1.PullIfNotPresent {
		t.Errorf("lockstep's QEMU image volume: %+v", qemu)
	}
	mounted := func(c corev1.Container, path, subPath string) bool {
		for _, m := range c.VolumeMounts {
			if m.MountPath == path && m.SubPath == subPath {
				return true
			}
		}
		return false
	}
	// lockstep's QEMU, read-only, where the hook names the members' emulator.
	qemuMounted := func(c *corev1.Container) bool {
		for _, m := range c.VolumeMounts {
			if m.Name == "lockstep-qemu" && m.ReadOnly && m.MountPath == kubevirthook.LockstepQEMUMount {
				return true
			}
		}
		return false
	}
	var compute, hook *corev1.Container
	for i := range pod.Spec.Containers {
		switch pod.Spec.Containers[i].Name {
		case "compute":
			compute = &pod.Spec.Containers[i]
		case "lockstep-hook":
			hook = &pod.Spec.Containers[i]
		}
	}
	if compute == nil || !mounted(*compute, dir, "") {
		t.Errorf("the compute container does not mount %s: %+v", dir, compute)
	}
	if compute == nil || !qemuMounted(compute) {
		t.Errorf("the compute container does not mount lockstep's QEMU read-only where the hook names it (%s): %+v", kubevirthook.LockstepQEMU, compute)
	}
	if hook == nil || !mounted(*hook, "/var/run/kubevirt-plugin/lockstep", "lockstep") ||
		!strings.Contains(strings.Join(hook.Args, " "), "--plugin-socket=/var/run/kubevirt-plugin/lockstep/hook.sock") ||
		hook.Resources.Requests.Cpu().Cmp(*hook.Resources.Limits.Cpu()) != 0 || hook.Resources.Requests.Memory().Cmp(*hook.Resources.Limits.Memory()) != 0 {
		t.Errorf("the hook's sidecar: %+v", hook)
	}

	plain := launcher(false)
	if err := k8s.Create(ctx, plain, client.DryRunAll); err != nil {
		t.Fatal(err)
	}
	if len(plain.Spec.Containers) != 1 || len(plain.Spec.Volumes) != 1 {
		t.Errorf("a plain VM's launcher pod was changed: %+v", plain.Spec)
	}
}

// pluginCondition evaluates a Plugin's condition on vmi as KubeVirt v1.9.0's virt-launcher does
// before it calls a plugin's domain hooks (pkg/virt-launcher/virtwrap/plugins/cel/evaluator.go):
// cel-go's native types, so Go field names, with the variables vmi and domainSpec, and a result
// that must be a bool. virt-api compiles it the same way when the Plugin is written.
func pluginCondition(condition string, vmi *virtv1.VirtualMachineInstance) (bool, error) {
	env, err := cel.NewEnv(
		ext.NativeTypes(reflect.TypeOf(&libvirtxml.Domain{}), reflect.TypeOf(&virtv1.VirtualMachineInstance{})),
		cel.Container("libvirtxml"),
		cel.Variable("vmi", cel.ObjectType("v1.VirtualMachineInstance")),
		cel.Variable("domainSpec", cel.ObjectType("libvirtxml.Domain")),
	)
	if err != nil {
		return false, err
	}
	ast, issues := env.Compile(condition)
	if issues.Err() != nil {
		return false, issues.Err()
	}
	if ast.OutputType() != cel.BoolType {
		return false, fmt.Errorf("the condition returns %s, not a bool", ast.OutputType())
	}
	prg, err := env.Program(ast)
	if err != nil {
		return false, err
	}
	out, _, err := prg.Eval(map[string]any{"vmi": vmi, "domainSpec": &libvirtxml.Domain{}})
	if err != nil {
		return false, err
	}
	b, ok := out.Value().(bool)
	if !ok {
		return false, fmt.Errorf("the condition gave %v", out.Value())
	}
	return b, nil
}
