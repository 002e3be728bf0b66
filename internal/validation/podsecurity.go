package validation

import "fmt"

// The Pod Security admission label that sets a namespace's enforced level.
const podSecurityEnforce = "pod-security.kubernetes.io/enforce"

// PodSecurityProblem says why members could not run in a namespace with these labels ("" when
// they can): a member's launcher pod mounts its member directory from the node (a hostPath), which
// Pod Security's baseline and restricted levels refuse. A namespace that enforces no level has
// the cluster's default, which admission cannot read: docs/install.md says what it must be.
func PodSecurityProblem(labels map[string]string) string {
	switch level := labels[podSecurityEnforce]; level {
	case "baseline", "restricted":
		return fmt.Sprintf("the namespace enforces Pod Security level %q (label %s), which refuses the hostPath that each member's launcher pod "+
			"mounts (lockstepd reaches the member's QEMU through it): label the namespace %s=privileged, or run the VM in a namespace that is",
			level, podSecurityEnforce, podSecurityEnforce)
	}
	return ""
}
