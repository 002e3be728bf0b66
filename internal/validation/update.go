package validation

import (
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// ValidateUpdate returns why a change from old to new is refused: the update policy Refuse
// forbids template changes while the VM runs. Under Staged (the default) every template change
// is accepted and waits for the next halt and run (the RestartRequired condition).
func ValidateUpdate(old, new *ftv1.FaultTolerantVM) field.ErrorList {
	if new.Spec.UpdatePolicy != ftv1.UpdatePolicyRefuse || old.Spec.RunStrategy == ftv1.RunStrategyHalted {
		return nil
	}
	if equality.Semantic.DeepEqual(old.Spec.Template, new.Spec.Template) {
		return nil
	}
	return field.ErrorList{field.Forbidden(field.NewPath("spec", "template"),
		"updatePolicy is Refuse and the VM runs: set runStrategy to Halted first, then change the template and run it again (or set updatePolicy to Staged)")}
}
