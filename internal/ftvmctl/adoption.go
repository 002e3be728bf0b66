package ftvmctl

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/adoption"
)

// adopt makes the FaultTolerantVM that takes VirtualMachine name over (adoption.FaultTolerantVM:
// its template with the firmware UUID and MACs its guest sees, read from its running VMI) and
// creates it, or, with output "yaml", prints it to be kept where the cluster's manifests are.
func adopt(ctx context.Context, c client.Client, env Env, ns, name, loggingNetwork, output string, say func(string, ...any)) error {
	if loggingNetwork == "" {
		return fmt.Errorf("adopt: --logging-network is required (the NetworkAttachmentDefinition lockstepd replicates over, as \"name\" or \"namespace/name\")")
	}
	if output != "" && output != "yaml" {
		return fmt.Errorf("adopt: -o %q: only yaml", output)
	}
	key := types.NamespacedName{Namespace: ns, Name: name}
	vm := &virtv1.VirtualMachine{}
	if err := c.Get(ctx, key, vm); err != nil {
		return fmt.Errorf("VirtualMachine %s/%s: %w", ns, name, err)
	}
	vmi := &virtv1.VirtualMachineInstance{}
	if err := c.Get(ctx, key, vmi); apierrors.IsNotFound(err) {
		vmi = nil
	} else if err != nil {
		return fmt.Errorf("VirtualMachineInstance %s/%s: %w", ns, name, err)
	}
	f, err := adoption.FaultTolerantVM(vm, vmi, loggingNetwork)
	if err != nil {
		return err
	}
	if output == "yaml" {
		// A manifest: no status, and no creationTimestamp (null in a Go object not yet created).
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(f)
		if err != nil {
			return err
		}
		delete(obj, "status")
		unstructured.RemoveNestedField(obj, "metadata", "creationTimestamp")
		raw, err := yaml.Marshal(obj)
		if err != nil {
			return err
		}
		_, err = env.Out.Write(raw)
		return err
	}
	if err := c.Create(ctx, f); err != nil {
		return fmt.Errorf("creating FaultTolerantVM %s/%s: %w", ns, name, err)
	}
	say("faulttolerantvm.ft.lockstep.dev/%s created: the operator stops VirtualMachine %s, removes it (its disks stay) and starts the pair on its disks; the guest restarts once", f.Name, name)
	return nil
}

// release sets onDelete Release on a FaultTolerantVM and deletes it: once its members are gone a
// VirtualMachine of its name runs the VM. With wait, it follows until that VirtualMachine exists.
func release(ctx context.Context, c client.Client, ns, name string, wait time.Duration, say func(string, ...any)) error {
	f := &ftv1.FaultTolerantVM{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, f); err != nil {
		return fmt.Errorf("FaultTolerantVM %s/%s: %w", ns, name, err)
	}
	if f.Spec.DiskRetention == ftv1.DiskRetentionDelete {
		return fmt.Errorf("release: FaultTolerantVM %s has diskRetention Delete; set it to Retain first, so that the VM's current disks are kept for the VirtualMachine", name)
	}
	if f.Spec.OnDelete != ftv1.OnDeleteRelease {
		base := f.DeepCopy()
		f.Spec.OnDelete = ftv1.OnDeleteRelease
		if err := c.Patch(ctx, f, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return fmt.Errorf("setting onDelete Release: %w", err)
		}
	}
	if err := c.Delete(ctx, f, client.Preconditions{UID: &f.UID}); err != nil {
		return fmt.Errorf("deleting FaultTolerantVM %s: %w", name, err)
	}
	say("faulttolerantvm.ft.lockstep.dev/%s releasing: its members stop, then VirtualMachine %s runs the VM on its current disks", name, name)
	if wait <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		vm := &virtv1.VirtualMachine{}
		err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, vm)
		switch {
		case err == nil && vm.Annotations[adoption.AnnotationReleasedFrom] == string(f.UID):
			say("virtualmachine.kubevirt.io/%s runs the VM", name)
			return nil
		case err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil:
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("release: no VirtualMachine %s after %s (see kubectl describe ftvm %s: a VirtualMachine of that name that lockstep did not make blocks it, ReleaseBlocked)", name, wait, name)
		case <-time.After(time.Second):
		}
	}
}
