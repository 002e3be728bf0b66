package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// phaseProtection carries out spec.protection: vSphere FT's Suspend and Turn Off stop the
// secondary and leave the primary running alone; Enabled starts one again (phaseEnsureSecondary).
// Suspended keeps the secondary's node reserved for the pair: the node goes into the pair's
// record before the secondary is stopped, and placement counts it (Placer.view) until the pair
// has a secondary again, which takes that place first.
func (r *FaultTolerantVMReconciler) phaseProtection(ctx context.Context, s *scope) error {
	want := s.ftvm.Spec.Protection
	if !s.unprotectedByChoice() {
		if s.record.ReservedNode != "" && s.secondary != nil && s.secondary.synced() {
			// Resumed: the secondary took the reservation's place. (Placement stops counting the
			// reservation once the pair has a secondary; released once it is synchronized, the
			// release follows the synchronization's mark in one order, whatever the cache shows.)
			return r.reserve(ctx, s, "")
		}
		return nil
	}
	s.protectionOff = true
	if s.primary == nil {
		return nil
	}
	reserve := ""
	if want == ftv1.ProtectionSuspended {
		reserve = s.record.ReservedNode
		if reserve == "" && s.secondary != nil {
			reserve = s.secondary.node
		}
	}
	if reserve != s.record.ReservedNode {
		if err := r.reserve(ctx, s, reserve); err != nil {
			return err
		}
	}
	if s.secondary == nil {
		return nil
	}
	reason, why := ftv1.ReasonProtectionDisabled, "spec.protection is Disabled"
	if want == ftv1.ProtectionSuspended {
		reason, why = ftv1.ReasonProtectionSuspended, fmt.Sprintf("spec.protection is Suspended; node %s stays reserved for the secondary", reserve)
	}
	mv := s.secondary
	if err := r.retire(ctx, s, mv, reason, why); err != nil {
		return r.retryOnRace(s, err)
	}
	r.Recorder.Eventf(s.ftvm, mv.vmi, corev1.EventTypeNormal, reason, "StopSecondary",
		"secondary %s on node %s stopped: %s; the VM runs unprotected", mv.vmi.Name, mv.node, why)
	s.secondary = nil
	return nil
}

// unprotectedByChoice says whether spec.protection keeps the pair without a secondary.
func (s *scope) unprotectedByChoice() bool {
	p := s.ftvm.Spec.Protection
	return p != "" && p != ftv1.ProtectionEnabled
}

// reserve writes node as the pair's reserved node ("" releases it), by compare-and-set on the
// record as the API server has it.
func (r *FaultTolerantVMReconciler) reserve(ctx context.Context, s *scope, node string) error {
	fresh, err := r.freshRecord(ctx, s.ftvm)
	if err != nil {
		return err
	}
	if !fresh.Exists || fresh.ReservedNode == node {
		s.record = fresh
		return nil
	}
	next := fresh.Record
	next.ReservedNode = node
	if err := r.writeRecord(ctx, s.ftvm, fresh, next, fresh.holderNode); err != nil {
		return r.retryOnRace(s, err)
	}
	s.record = fresh
	return nil
}
