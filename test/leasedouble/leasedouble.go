// Package leasedouble is a test double of the pair's Lease (internal/arbiter, an engine.Arbiter): the same
// compare-and-set rule on epochs, in memory, with a switch that makes the API server unreachable.
// The agent's unit tests and the VM tier use it; the real Lease is tested against a real
// kube-apiserver in internal/arbiter and in the data-plane tier.
package leasedouble

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/lockstep-dev/lockstep/internal/engine"
)

// ErrDown is returned while the Lease is unreachable.
var ErrDown = errors.New("the API server is unreachable")

// Lease is one pair's Lease.
type Lease struct {
	mu     sync.Mutex
	holder engine.Holder
	down   bool
	// downFor makes the Lease unreachable for some identities only (a node cut from the API
	// server while the others are not).
	downFor  map[string]bool
	renewals map[string]int
}

// SetDownFor makes the Lease unreachable (true) or reachable again for the side id alone.
func (l *Lease) SetDownFor(id string, down bool) {
	l.mu.Lock()
	if l.downFor == nil {
		l.downFor = map[string]bool{}
	}
	l.downFor[id] = down
	l.mu.Unlock()
}

// Renewals counts the renewals that went through, by the identity that wrote them.
func (l *Lease) Renewals(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewals[id]
}

// SetDown makes the Lease unreachable (true) or reachable again.
func (l *Lease) SetDown(down bool) {
	l.mu.Lock()
	l.down = down
	l.mu.Unlock()
}

// Hold makes id the holder at epoch, as the operator does when it gives the record to a member.
func (l *Lease) Hold(id string, epoch uint64) {
	l.mu.Lock()
	l.holder = engine.Holder{Identity: id, Epoch: epoch}
	l.mu.Unlock()
}

// Holder is the current holder.
func (l *Lease) Holder() engine.Holder {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.holder
}

// Side is the Lease as one side (identity id) sees it: a engine.Arbiter.
func (l *Lease) Side(id string) Side { return Side{l: l, id: id} }

// Side implements engine.Arbiter for one identity.
type Side struct {
	l  *Lease
	id string
}

// Ensure creates the Lease for this side at epoch 1 if there is none, and returns its holder.
func (s Side) Ensure(context.Context) (engine.Holder, error) {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	if s.l.down || s.l.downFor[s.id] {
		return engine.Holder{}, ErrDown
	}
	if s.l.holder.Epoch == 0 {
		s.l.holder = engine.Holder{Identity: s.id, Epoch: 1}
	}
	h := s.l.holder
	h.Self = h.Identity == s.id
	return h, nil
}

// Claim takes the epoch after known, if known is still the current one.
func (s Side) Claim(_ context.Context, known uint64) (uint64, error) {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	if s.l.down || s.l.downFor[s.id] {
		return 0, ErrDown
	}
	epoch, write, err := engine.DecideClaim(s.l.holder, s.id, known)
	if write {
		s.l.holder = engine.Holder{Identity: s.id, Epoch: epoch}
	}
	return epoch, err
}

// Renew renews the term while the Lease names member at epoch.
func (s Side) Renew(_ context.Context, epoch uint64, member string) error {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	if s.l.down || s.l.downFor[s.id] {
		return ErrDown
	}
	_, holderMember, _ := strings.Cut(s.l.holder.Identity, "/")
	if holderMember == "" {
		holderMember = s.l.holder.Identity
	}
	if err := engine.RenewDecision(s.l.holder, holderMember, member, epoch); err != nil {
		return err
	}
	if s.l.renewals == nil {
		s.l.renewals = map[string]int{}
	}
	s.l.renewals[s.id]++
	return nil
}
