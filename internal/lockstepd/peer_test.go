package lockstepd

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/scheme"
)

// TestPeerOfNamesWhoseReplicasTheSecondaryHolds: a primary's peer is its secondary on another
// node, with the addresses its lockstepd published and, when the operator handed it an earlier
// secondary's copies, that secondary's name for the engine's incremental resync. A secondary's
// peer, its primary, names none.
func TestPeerOfNamesWhoseReplicasTheSecondaryHolds(t *testing.T) {
	member := func(name, role, node string, annotations map[string]string) virtv1.VirtualMachineInstance {
		return virtv1.VirtualMachineInstance{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: map[string]string{ftv1.LabelRole: role}, Annotations: annotations},
			Status:     virtv1.VirtualMachineInstanceStatus{NodeName: node, Phase: virtv1.Running},
		}
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b", Annotations: map[string]string{
		ftv1.AnnotationNodeLoggingAddress: "10.0.0.2:7410", ftv1.AnnotationNodeStreamAddress: "10.0.0.2:7411"}}}
	primaryNode := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
	all := []virtv1.VirtualMachineInstance{
		member("vm-1", ftv1.RolePrimary, "node-a", nil),
		member("vm-3", ftv1.RoleSecondary, "node-b", map[string]string{ftv1.AnnotationReplicaOf: "vm-2"}),
	}
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(node, primaryNode).Build()

	d := &Daemon{Config: Config{NodeName: "node-a"}, Client: c}
	p, ok, err := d.peerOf(context.Background(), &all[0], true, all)
	if err != nil || !ok {
		t.Fatalf("the primary's peer: %v, %v", ok, err)
	}
	if p.VMI != "vm-3" || p.Node != "node-b" || p.Addr != "10.0.0.2:7410" || p.StreamAddr != "10.0.0.2:7411" || p.ReplicaOf != "vm-2" {
		t.Fatalf("the primary's peer: %+v", p)
	}

	d = &Daemon{Config: Config{NodeName: "node-b"}, Client: c}
	p, ok, err = d.peerOf(context.Background(), &all[1], false, all)
	if err != nil || !ok || p.VMI != "vm-1" || p.ReplicaOf != "" {
		t.Fatalf("the secondary's peer: %+v, %v, %v", p, ok, err)
	}
}
