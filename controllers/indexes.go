package controllers

import (
	"context"

	coordinationv1 "k8s.io/api/coordination/v1"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// Field indexes, so that the reconciler reads what it needs without listing everything.
const (
	// indexMemberByPair indexes member VMIs by their FaultTolerantVM's name.
	indexMemberByPair = "lockstep.pair"
	// indexMemberByNode indexes member VMIs by the node placement chose.
	indexMemberByNode = "lockstep.node"
	// indexFTVMNeedsCapacity indexes FaultTolerantVMs that wait for a node ("true").
	indexFTVMNeedsCapacity = "lockstep.needsCapacity"
	// indexOperationByFTVM indexes FaultTolerantVMOperations by the FaultTolerantVM they act on.
	indexOperationByFTVM = "lockstep.operationFTVM"
	// indexFTVMProtection indexes FaultTolerantVMs by spec.protection.
	indexFTVMProtection = "lockstep.protection"
	// indexRecordReserves indexes the pairs' records that keep a node reserved ("true").
	indexRecordReserves = "lockstep.reserves"
	// indexFTVMAdoptFrom indexes FaultTolerantVMs by the VirtualMachine they adopt.
	indexFTVMAdoptFrom = "lockstep.adoptFrom"
)

// SetupIndexes registers the field indexes with the manager's cache.
func SetupIndexes(ctx context.Context, indexer client.FieldIndexer) error {
	if err := indexer.IndexField(ctx, &virtv1.VirtualMachineInstance{}, indexMemberByPair, func(o client.Object) []string {
		if p, ok := o.GetLabels()[ftv1.LabelPair]; ok {
			return []string{p}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := indexer.IndexField(ctx, &virtv1.VirtualMachineInstance{}, indexMemberByNode, func(o client.Object) []string {
		if n, ok := o.GetLabels()[ftv1.LabelNode]; ok {
			return []string{n}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := indexer.IndexField(ctx, &ftv1.FaultTolerantVMOperation{}, indexOperationByFTVM, func(o client.Object) []string {
		return []string{o.(*ftv1.FaultTolerantVMOperation).Spec.FaultTolerantVMName}
	}); err != nil {
		return err
	}
	if err := indexer.IndexField(ctx, &ftv1.FaultTolerantVM{}, indexFTVMProtection, func(o client.Object) []string {
		return []string{string(o.(*ftv1.FaultTolerantVM).Spec.Protection)}
	}); err != nil {
		return err
	}
	if err := indexer.IndexField(ctx, &ftv1.FaultTolerantVM{}, indexFTVMAdoptFrom, func(o client.Object) []string {
		if from := o.(*ftv1.FaultTolerantVM).Spec.AdoptFrom; from != nil {
			return []string{from.VirtualMachineName}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := indexer.IndexField(ctx, &coordinationv1.Lease{}, indexRecordReserves, func(o client.Object) []string {
		if o.GetAnnotations()[ftv1.AnnotationReservedNode] != "" {
			return []string{"true"}
		}
		return nil
	}); err != nil {
		return err
	}
	return indexer.IndexField(ctx, &ftv1.FaultTolerantVM{}, indexFTVMNeedsCapacity, func(o client.Object) []string {
		if needsCapacity(o.(*ftv1.FaultTolerantVM)) {
			return []string{"true"}
		}
		return nil
	})
}

// needsCapacity is true for a FaultTolerantVM that could not place a member.
func needsCapacity(ftvm *ftv1.FaultTolerantVM) bool {
	for _, c := range ftvm.Status.Conditions {
		if c.Reason == ftv1.ReasonNoEligibleNode {
			return true
		}
	}
	return false
}
