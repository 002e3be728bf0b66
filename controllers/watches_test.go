package controllers

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

func TestARenewalOfTheRecordDoesNotWakeTheReconcile(t *testing.T) {
	holder := "node-1/vm-1"
	epoch := int32(3)
	base := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "ft-vm", Annotations: map[string]string{ftv1.AnnotationLastOrdinal: "2"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseTransitions: &epoch, RenewTime: &metav1.MicroTime{Time: time.Unix(100, 0)}}}
	renewed := base.DeepCopy()
	renewed.Spec.RenewTime = &metav1.MicroTime{Time: time.Unix(106, 0)}
	renewed.Spec.LeaseDurationSeconds = new(int32(30))
	renewed.Annotations[ftv1.AnnotationRenewedBy] = "node-2/vm-2"
	if !onlyRenewed(base, renewed) {
		t.Error("a renewal counts as a change")
	}
	claimed := renewed.DeepCopy()
	other, next := "node-2/vm-2", int32(4)
	claimed.Spec.HolderIdentity, claimed.Spec.LeaseTransitions = &other, &next
	if onlyRenewed(renewed, claimed) {
		t.Error("a claim counts as a renewal")
	}
	annotated := renewed.DeepCopy()
	annotated.Annotations[ftv1.AnnotationLastOrdinal] = "3"
	if onlyRenewed(renewed, annotated) {
		t.Error("the operator's annotation counts as a renewal")
	}
}
