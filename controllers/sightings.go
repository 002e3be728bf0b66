package controllers

import (
	"sync"
	"time"
)

// Sightings notes when this operator first saw each value of a fact that another machine wrote
// with its own clock (a node lease's renewal, lockstepd's report of a side): the operator judges
// how old such a fact is by its own clock only, so that a node whose clock is minutes off changes
// no verdict. A restarted operator sees every value anew: that makes a fact look younger, which
// only delays a verdict. One Sightings serves the reconciler and the Placer.
type Sightings struct {
	mu   sync.Mutex
	seen map[string]sighting
}

type sighting struct {
	value string
	at    time.Time
}

// Seen returns when the operator first saw value as the value of key (now, if it is new).
func (s *Sightings) Seen(key, value string, now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = map[string]sighting{}
	}
	if cur, ok := s.seen[key]; ok && cur.value == value {
		return cur.at
	}
	s.seen[key] = sighting{value: value, at: now}
	return now
}

// Forget drops key (its object is gone).
func (s *Sightings) Forget(key string) {
	s.mu.Lock()
	delete(s.seen, key)
	s.mu.Unlock()
}
