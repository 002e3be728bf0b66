//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// promotions counts, from outside the operator, the secondaries that took over: a member seen as
// a secondary that later holds its pair's record (lockstepd's claim, or the operator's promotion,
// which writes the record before it relabels) or is labelled primary. A member that took over
// and was lost before the operator relabelled it took over all the same.
//
// It watches, from the resourceVersion it last saw, rather than polls: a poll misses a member
// that was promoted and deleted between two looks, and the counts must match exactly.
type promotions struct {
	mu       sync.Mutex
	owner    map[string]types.UID // member -> its FaultTolerantVM
	wasSec   map[string]bool
	promoted map[string]string               // member -> how it took over
	history  map[types.UID][]string          // FaultTolerantVM -> what was seen, for a failure
	pending  map[string]coordinationv1.Lease // record holder -> the record, until its member is known
	stopped  chan struct{}
}

func watchPromotions(ctx context.Context, c client.WithWatch) *promotions {
	p := &promotions{owner: map[string]types.UID{}, wasSec: map[string]bool{}, promoted: map[string]string{},
		history: map[types.UID][]string{}, pending: map[string]coordinationv1.Lease{}, stopped: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); follow(ctx, c, &virtv1.VirtualMachineInstanceList{}, p.member) }()
	go func() { defer wg.Done(); follow(ctx, c, &coordinationv1.LeaseList{}, p.record) }()
	go func() { wg.Wait(); close(p.stopped) }()
	return p
}

// follow hands every change of list's kind in the namespace to seen, resuming each watch where the
// last one ended; only when the API server has compacted that far does it start over.
func follow(ctx context.Context, c client.WithWatch, list client.ObjectList, seen func(client.Object)) {
	rv := ""
	for ctx.Err() == nil {
		w, err := c.Watch(ctx, list, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		if err != nil {
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				rv = ""
			}
			time.Sleep(poll)
			continue
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				if apierrors.IsResourceExpired(apierrors.FromObject(ev.Object)) || apierrors.IsGone(apierrors.FromObject(ev.Object)) {
					rv = ""
				}
				break
			}
			if obj, ok := ev.Object.(client.Object); ok {
				rv = obj.GetResourceVersion()
				if ev.Type != watch.Bookmark {
					seen(obj)
				}
			}
		}
		w.Stop()
	}
}

func (p *promotions) member(obj client.Object) {
	v, ok := obj.(*virtv1.VirtualMachineInstance)
	if !ok || v.Labels[ftv1.LabelManagedBy] != ftv1.ManagedByValue {
		return
	}
	owner := metav1.GetControllerOf(v)
	if owner == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.owner[v.Name] = owner.UID
	switch v.Labels[ftv1.LabelRole] {
	case ftv1.RoleSecondary:
		if !p.wasSec[v.Name] {
			p.wasSec[v.Name] = true
			p.note(owner.UID, "%s secondary on %s", v.Name, v.Labels[ftv1.LabelNode])
		}
		if l, ok := p.pending[v.Name]; ok {
			delete(p.pending, v.Name)
			p.holds(v.Name, l)
		}
	case ftv1.RolePrimary:
		if p.wasSec[v.Name] {
			p.take(v.Name, "labelled primary")
		}
	}
}

func (p *promotions) record(obj client.Object) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok || l.Labels[ftv1.LabelManagedBy] != ftv1.ManagedByValue {
		return
	}
	_, holder := ftv1.SplitIdentity(ptr.Deref(l.Spec.HolderIdentity, ""))
	if holder == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, known := p.owner[holder]; !known {
		// The two watches run apart: the member's first event may come after its record's.
		p.pending[holder] = *l
		return
	}
	p.holds(holder, *l)
}

// holds: member holds its pair's record l.
func (p *promotions) holds(member string, l coordinationv1.Lease) {
	if p.wasSec[member] {
		p.take(member, fmt.Sprintf("took the record at epoch %d", ptr.Deref(l.Spec.LeaseTransitions, 0)))
	}
}

func (p *promotions) take(member, how string) {
	if _, done := p.promoted[member]; done {
		return
	}
	p.promoted[member] = how
	p.note(p.owner[member], "%s %s", member, how)
}

func (p *promotions) note(uid types.UID, format string, args ...any) {
	p.history[uid] = append(p.history[uid], time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
}

// of counts the promotions of FaultTolerantVM uid's members.
func (p *promotions) of(uid types.UID) int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int32
	for member := range p.promoted {
		if p.owner[member] == uid {
			n++
		}
	}
	return n
}

func (p *promotions) total() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.promoted)
}

// seen is what was seen of FaultTolerantVM uid's members, in order.
func (p *promotions) seen(uid types.UID) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	lines := append([]string(nil), p.history[uid]...)
	sort.Strings(lines)
	out := ""
	for _, l := range lines {
		out += "  " + l + "\n"
	}
	return out
}
