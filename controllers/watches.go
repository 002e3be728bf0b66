package controllers

import (
	"context"
	"reflect"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// nodeHandler wakes the FaultTolerantVMs with a member on a node that changed, and, when the
// change may have freed capacity, the ones waiting for a node.
func (r *FaultTolerantVMReconciler) nodeHandler() handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		var vmis virtv1.VirtualMachineInstanceList
		if err := r.List(ctx, &vmis, client.MatchingFields{indexMemberByNode: o.GetName()}); err != nil {
			log.FromContext(ctx).Error(err, "listing the members of a node", "node", o.GetName())
			return nil
		}
		reqs := r.waitingForCapacity(ctx)
		for i := range vmis.Items {
			v := &vmis.Items[i]
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: v.Namespace, Name: v.Labels[ftv1.LabelPair]}})
		}
		return reqs
	})
}

// adoptedVMHandler wakes the FaultTolerantVM that adopts a VirtualMachine when that VirtualMachine
// changes: one that is stopping or gone lets the pair start, and one that comes back is stopped.
func (r *FaultTolerantVMReconciler) adoptedVMHandler() handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		var list ftv1.FaultTolerantVMList
		if err := r.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{indexFTVMAdoptFrom: o.GetName()}); err != nil {
			log.FromContext(ctx).Error(err, "listing the FaultTolerantVMs that adopt a VirtualMachine", "virtualMachine", o.GetName())
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(list.Items))
		for i := range list.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
		return reqs
	})
}

// capacityFreedHandler wakes the FaultTolerantVMs waiting for a node when a member goes.
func (r *FaultTolerantVMReconciler) capacityFreedHandler() handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		return r.waitingForCapacity(ctx)
	})
}

// waitingForCapacity lists the FaultTolerantVMs that could not place a member.
func (r *FaultTolerantVMReconciler) waitingForCapacity(ctx context.Context) []reconcile.Request {
	var list ftv1.FaultTolerantVMList
	if err := r.List(ctx, &list, client.MatchingFields{indexFTVMNeedsCapacity: "true"}); err != nil {
		log.FromContext(ctx).Error(err, "listing FaultTolerantVMs that wait for capacity")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

// builderPredicatesMemberGone passes member VMI deletions and ends (which free capacity).
func builderPredicatesMemberGone() builder.Predicates {
	return builder.WithPredicates(predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		DeleteFunc:  func(e event.DeleteEvent) bool { return isMember(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*virtv1.VirtualMachineInstance), e.ObjectNew.(*virtv1.VirtualMachineInstance)
			return isMember(n) && !o.IsFinal() && n.IsFinal()
		},
	})
}

func isMember(o client.Object) bool {
	_, ok := o.GetLabels()[ftv1.LabelPair]
	return ok
}

// builderPredicatesNodeChanged passes node changes that matter to placement or to member health
// (readiness, taints, cordon, labels, FT limit annotations), not the kubelet's heartbeats.
func builderPredicatesNodeChanged() builder.Predicates {
	return builder.WithPredicates(predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
			return readyStatus(o) != readyStatus(n) ||
				o.Spec.Unschedulable != n.Spec.Unschedulable ||
				!reflect.DeepEqual(o.Spec.Taints, n.Spec.Taints) ||
				!reflect.DeepEqual(o.Labels, n.Labels) ||
				!reflect.DeepEqual(o.Annotations, n.Annotations)
		},
	})
}

func readyStatus(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return corev1.ConditionUnknown
}

// launcherPodHandler maps a launcher pod to its pair (the pod carries the member's labels).
func launcherPodHandler() handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		pair := o.GetLabels()[ftv1.LabelPair]
		if pair == "" || o.GetLabels()[virtv1.CreatedByLabel] == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: pair}}}
	})
}

// launcherRoleChanged passes a launcher pod's creation and a change of its role label; its
// status updates are many and say nothing the reconciler needs.
func launcherRoleChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld.GetLabels()[ftv1.LabelRole] != e.ObjectNew.GetLabels()[ftv1.LabelRole]
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// operationHandler wakes the FaultTolerantVM an operation acts on.
func operationHandler() handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		op := o.(*ftv1.FaultTolerantVMOperation)
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: op.Namespace, Name: op.Spec.FaultTolerantVMName}}}
	})
}

// builderPredicatesRecordChanged wakes the reconcile for a change of the pair's record that means
// something to it (a claim, a new holder or epoch, the operator's annotations), not for a
// renewal of its term: the side that runs the VM renews it every few seconds. renewalObserver
// dates each renewal as the watch delivers it, without a reconcile.
func builderPredicatesRecordChanged() builder.Predicates {
	return builder.WithPredicates(predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*coordinationv1.Lease), e.ObjectNew.(*coordinationv1.Lease)
			return !onlyRenewed(o, n)
		},
	})
}

// onlyRenewed says whether n differs from o only by a renewal: its renew time, its term and who
// renewed it.
func onlyRenewed(o, n *coordinationv1.Lease) bool {
	strip := func(l *coordinationv1.Lease) (coordinationv1.LeaseSpec, map[string]string, map[string]string) {
		spec := *l.Spec.DeepCopy()
		spec.RenewTime, spec.LeaseDurationSeconds = nil, nil
		ann := map[string]string{}
		for k, v := range l.Annotations {
			if k != ftv1.AnnotationRenewedBy {
				ann[k] = v
			}
		}
		return spec, ann, l.Labels
	}
	oSpec, oAnn, oLab := strip(o)
	nSpec, nAnn, nLab := strip(n)
	return reflect.DeepEqual(oSpec, nSpec) && reflect.DeepEqual(oAnn, nAnn) && reflect.DeepEqual(oLab, nLab) &&
		reflect.DeepEqual(o.OwnerReferences, n.OwnerReferences) && o.DeletionTimestamp.Equal(n.DeletionTimestamp)
}

// renewalObserver notes when each renewal of a pair's record arrives (term.go), and wakes no
// reconcile: the operator then dates a renewal when it happened, give or take the watch's delay,
// rather than at its next reconcile (which would make it look younger, and delay a restart).
func (r *FaultTolerantVMReconciler) renewalObserver() handler.EventHandler {
	observe := func(o client.Object) {
		if l, ok := o.(*coordinationv1.Lease); ok && l.Labels[ftv1.LabelPair] != "" {
			recordRenewalSeen(r.Sightings, l, r.Clock.Now())
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			observe(e.Object)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			observe(e.ObjectNew)
		},
	}
}
