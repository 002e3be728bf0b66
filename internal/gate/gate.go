// Package gate is the output commit rule (white paper 2.3): an output of the primary (a packet,
// a disk write acknowledgement) is tagged with the log position that precedes it and released only
// once the secondary has acknowledged that position, so that whatever a client saw survives a
// failover. Outputs leave in the order they were produced. The gate is pure; the in-process API and
// the NFQUEUE backend in lockstepd hold their outputs through it.
package gate

import "fmt"

// Gate holds outputs of type T until the log position they follow is acknowledged.
type Gate[T any] struct {
	acked uint64
	last  uint64 // position of the newest held output
	held  []held[T]
}

type held[T any] struct {
	pos uint64
	out T
}

// Hold takes an output produced after log entry pos and returns the outputs that may leave now,
// in order (the output itself when pos is already acknowledged and nothing is held before it).
// Positions must not go backwards: the log only grows.
func (g *Gate[T]) Hold(pos uint64, out T) ([]T, error) {
	if pos < g.last {
		return nil, fmt.Errorf("output after log position %d held after one at %d: positions go backwards", pos, g.last)
	}
	g.last = pos
	if pos <= g.acked && len(g.held) == 0 {
		return []T{out}, nil
	}
	g.held = append(g.held, held[T]{pos, out})
	return g.release(), nil
}

// Ack records that the secondary acknowledged every entry up to seq and returns the outputs that
// may leave now, in order.
func (g *Gate[T]) Ack(seq uint64) []T {
	if seq > g.acked {
		g.acked = seq
	}
	return g.release()
}

func (g *Gate[T]) release() []T {
	n := 0
	for n < len(g.held) && g.held[n].pos <= g.acked {
		n++
	}
	if n == 0 {
		return nil
	}
	out := make([]T, n)
	for i := range n {
		out[i] = g.held[i].out
	}
	g.held = append(g.held[:0:0], g.held[n:]...)
	return out
}

// Held is the number of outputs waiting.
func (g *Gate[T]) Held() int { return len(g.held) }

// Acked is the acknowledged log position.
func (g *Gate[T]) Acked() uint64 { return g.acked }

// Drop takes out every held output and returns them, never to be released: the primary lost the
// right to speak (it was fenced), so what it held must never leave.
func (g *Gate[T]) Drop() []T {
	out := make([]T, len(g.held))
	for i, h := range g.held {
		out[i] = h.out
	}
	g.held = nil
	return out
}
