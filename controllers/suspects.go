package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/health"
	"github.com/lockstep-dev/lockstep/internal/roles"
)

// Suspect nodes. A node where a member of the pair was lost or fenced may be dying before the
// API server says so (its kubelet's last report still reads Ready): a new member of the pair does
// not go there until the node proves healthy. The suspicion is kept in the pair's record
// (ftv1.AnnotationSuspectNodes), written before the member is let go, so that a restarted
// operator, or the next reconcile after the member's VMI is gone, still finds it. What proves the
// node healthy is a change observed since the suspicion, never a comparison of the node's clock
// with the operator's: its lockstepd renewed its node lease, its kubelet renewed its own lease
// (where lockstepd does not run), or its Ready condition turned True again.

// suspicion is what the operator saw of a suspect node when it lost a member there.
type suspicion struct {
	// Since is when, on the operator's clock (for people: nothing compares it).
	Since string `json:"since"`
	// Lockstepd and Kubelet are the node's lockstepd lease and kubelet lease as seen then
	// ("holder@renewTime"; "" when there was none).
	Lockstepd string `json:"lockstepd,omitempty"`
	Kubelet   string `json:"kubelet,omitempty"`
	// Ready is the Node's Ready condition then ("status@lastTransitionTime").
	Ready string `json:"ready,omitempty"`
	// Why is the member lost there.
	Why string `json:"why,omitempty"`
}

func decodeSuspects(s string) map[string]suspicion {
	out := map[string]suspicion{}
	if s != "" {
		_ = json.Unmarshal([]byte(s), &out) // a hand-edited value is dropped at the next write
	}
	return out
}

func encodeSuspects(m map[string]suspicion) string {
	if len(m) == 0 {
		return ""
	}
	b, _ := json.Marshal(m) // map keys sorted: the same suspicions write the same value
	return string(b)
}

// nodeSigns are the signs of life of a node, as the operator reads them now.
type nodeSigns struct {
	gone                       bool
	lockstepd, kubelet, ready  string
	hasLockstepd, readyNowTrue bool
}

func (r *FaultTolerantVMReconciler) signsOf(ctx context.Context, node string) (nodeSigns, error) {
	var sg nodeSigns
	n := &corev1.Node{}
	if err := r.Get(ctx, types.NamespacedName{Name: node}, n); apierrors.IsNotFound(err) {
		sg.gone = true
		return sg, nil
	} else if err != nil {
		return sg, err
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			sg.ready = fmt.Sprintf("%s@%s", c.Status, c.LastTransitionTime.UTC().Format(time.RFC3339))
			sg.readyNowTrue = c.Status == corev1.ConditionTrue
		}
	}
	lease := &coordinationv1.Lease{}
	err := r.Get(ctx, types.NamespacedName{Namespace: r.Config.LockstepdNamespace, Name: ftv1.NodeLeaseName(node)}, lease)
	switch {
	case err == nil:
		sg.lockstepd, sg.hasLockstepd = health.LeaseRenewal(lease), true
	case !apierrors.IsNotFound(err):
		return sg, err
	}
	// The kubelet's lease is not in the cache (it holds lockstep's own Leases only).
	err = r.APIReader.Get(ctx, types.NamespacedName{Namespace: corev1.NamespaceNodeLease, Name: node}, lease)
	switch {
	case err == nil:
		sg.kubelet = health.LeaseRenewal(lease)
	case !apierrors.IsNotFound(err):
		return sg, err
	}
	return sg, nil
}

// holderOf is the holder part of a lease sign.
func holderOf(sign string) string {
	if i := strings.LastIndex(sign, "@"); i >= 0 {
		return sign[:i]
	}
	return sign
}

// renewedSince says whether a lease seen as then was renewed by the same holder since.
func renewedSince(then, now string) bool {
	return then != "" && now != "" && now != then && holderOf(now) == holderOf(then)
}

// cleared says why a node suspected as sus proves healthy now ("" while it does not).
func (sg nodeSigns) cleared(sus suspicion) string {
	switch {
	case sg.gone:
		return "the node is gone"
	case renewedSince(sus.Lockstepd, sg.lockstepd):
		return "its lockstepd renewed its node lease"
	case !sg.hasLockstepd && renewedSince(sus.Kubelet, sg.kubelet):
		return "its kubelet renewed its lease"
	case sg.readyNowTrue && sg.ready != sus.Ready:
		return "it turned Ready again"
	}
	return ""
}

// judgeSuspects keeps the pair's suspect nodes that have not proved healthy, for placement, and
// drops the others from the record (at its next write).
func (r *FaultTolerantVMReconciler) judgeSuspects(ctx context.Context, s *scope) error {
	for _, node := range sortedKeys(s.record.suspects) {
		sg, err := r.signsOf(ctx, node)
		if err != nil {
			return err
		}
		if why := sg.cleared(s.record.suspects[node]); why != "" {
			delete(s.record.suspects, node)
			continue
		}
		s.suspect = append(s.suspect, node)
	}
	return nil
}

// suspectNodesOf marks, before the plan is carried out, the nodes of the members it lets go: every
// fenced member's and every lost secondary's for this reconcile, and (see leaving.kept) most of
// them also in the record, in memory, for the record's next write. It says whether it added any
// to the record.
func (r *FaultTolerantVMReconciler) suspectNodesOf(ctx context.Context, s *scope, plan roles.Plan) (bool, error) {
	type leaving struct {
		mv *memberView
		// kept: its node is recorded as suspect. A member lost is; so is a primary the record
		// left (lockstepd's secondary claimed it: it stopped hearing the primary, which the API
		// server may not know yet), but not one that an operation (a test failover) moved off a
		// healthy node, nor a duplicate primary.
		kept bool
	}
	var going []leaving
	for _, f := range plan.Fence {
		mv := s.member(f.Name)
		going = append(going, leaving{mv, mv.verdict.State == health.Lost || !f.Duplicate && s.operation == nil})
	}
	for _, d := range plan.Drop {
		if mv := s.member(d.Name); mv.verdict.State == health.Lost {
			going = append(going, leaving{mv, true})
		}
	}
	added := false
	for _, g := range going {
		mv := g.mv
		s.suspect = append(s.suspect, mv.node)
		if _, ok := s.record.suspects[mv.node]; ok || mv.node == "" || !g.kept {
			continue
		}
		sg, err := r.signsOf(ctx, mv.node)
		if err != nil {
			return false, err
		}
		if sg.gone {
			continue
		}
		if s.record.suspects == nil {
			s.record.suspects = map[string]suspicion{}
		}
		s.record.suspects[mv.node] = suspicion{Since: r.Clock.Now().UTC().Format(time.RFC3339), Lockstepd: sg.lockstepd,
			Kubelet: sg.kubelet, Ready: sg.ready, Why: fmt.Sprintf("%s: %s", mv.vmi.Name, mv.verdict.Reason)}
		added = true
	}
	return added, nil
}

func sortedKeys(m map[string]suspicion) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
