package v1alpha1

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
)

func TestDefault(t *testing.T) {
	empty := &FaultTolerantVM{}
	Default(empty)
	if empty.Spec.RunStrategy != RunStrategyRunning || empty.Spec.UpdatePolicy != UpdatePolicyStaged || empty.Spec.Protection != ProtectionEnabled || empty.Spec.DiskRetention != DiskRetentionRetain || empty.Spec.OnDelete != OnDeleteStop {
		t.Fatalf("defaults not set: %+v", empty.Spec)
	}
	again := empty.DeepCopy()
	Default(again)
	if !equality.Semantic.DeepEqual(empty, again) {
		t.Fatal("defaulting twice changed the object: a GitOps tool would see drift")
	}
	set := &FaultTolerantVM{Spec: FaultTolerantVMSpec{RunStrategy: RunStrategyHalted, UpdatePolicy: UpdatePolicyRefuse, Protection: ProtectionDisabled, DiskRetention: DiskRetentionDelete, OnDelete: OnDeleteRelease}}
	Default(set)
	if set.Spec.RunStrategy != RunStrategyHalted || set.Spec.UpdatePolicy != UpdatePolicyRefuse || set.Spec.Protection != ProtectionDisabled || set.Spec.DiskRetention != DiskRetentionDelete || set.Spec.OnDelete != OnDeleteRelease {
		t.Fatalf("defaulting overwrote what was set: %+v", set.Spec)
	}
}
