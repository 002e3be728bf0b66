package lockstepd

import (
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// MemberOf is the member a VMI on node is: its pair, its identity in the pair's record, its role
// as its label says.
func MemberOf(vmi *virtv1.VirtualMachineInstance, node string) MemberSpec {
	return MemberSpec{
		Pair:     vmi.Namespace + "/" + vmi.Labels[ftv1.LabelPair],
		VMI:      vmi.Name,
		UID:      string(vmi.UID),
		Identity: identityOf(node, vmi.Name),
		Primary:  vmi.Labels[ftv1.LabelRole] == ftv1.RolePrimary,
	}
}
