package lockstepd

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

func TestMemberOfAVMI(t *testing.T) {
	vmi := func(role string) *virtv1.VirtualMachineInstance {
		return &virtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "db-2", UID: "0b5a4c3e-1d2f-4a6b-9c8d-7e6f5a4b3c2d",
			Labels: map[string]string{ftv1.LabelPair: "db", ftv1.LabelRole: role}}}
	}
	for _, tc := range []struct {
		role    string
		primary bool
	}{{ftv1.RolePrimary, true}, {ftv1.RoleSecondary, false}, {ftv1.RoleFenced, false}} {
		got := MemberOf(vmi(tc.role), "node-3")
		want := MemberSpec{Pair: "prod/db", VMI: "db-2", UID: "0b5a4c3e-1d2f-4a6b-9c8d-7e6f5a4b3c2d", Identity: "node-3/db-2", Primary: tc.primary}
		if got != want {
			t.Errorf("%s: %+v, want %+v", tc.role, got, want)
		}
	}
	n := &Node{Config: Config{RunDir: "/var/run/lockstep"}}
	if d := n.Dir(MemberOf(vmi(ftv1.RolePrimary), "node-3")); d != "/var/run/lockstep/0b5a4c3e-1d2f-4a6b-9c8d-7e6f5a4b3c2d" {
		t.Errorf("member directory %s", d)
	}
}
