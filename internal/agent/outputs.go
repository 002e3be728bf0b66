package agent

import (
	"sync"

	"github.com/lockstep-dev/lockstep/internal/gate"
)

// outputGate is a backend of the output commit gate: positions are the agent's output positions.
type outputGate interface {
	Ack(pos uint64)
	Fence()
	Held() int
}

// processGate is the in-process backend: outputs are functions that send them.
type processGate struct {
	mu     sync.Mutex
	g      gate.Gate[func()]
	fenced bool
	// releasing serializes releases so that outputs leave in order even when acknowledgements
	// arrive from different goroutines.
	releasing sync.Mutex
}

func (p *processGate) Hold(pos uint64, release func()) {
	p.releasing.Lock()
	defer p.releasing.Unlock()
	p.mu.Lock()
	if p.fenced {
		p.mu.Unlock()
		return
	}
	out, err := p.g.Hold(pos, release)
	p.mu.Unlock()
	if err != nil {
		panic(err) // the agent's positions only grow
	}
	run(out)
}

func (p *processGate) Ack(pos uint64) {
	p.releasing.Lock()
	defer p.releasing.Unlock()
	p.mu.Lock()
	if p.fenced {
		p.mu.Unlock()
		return
	}
	out := p.g.Ack(pos)
	p.mu.Unlock()
	run(out)
}

func (p *processGate) Fence() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fenced = true
	p.g.Drop()
}

func (p *processGate) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.g.Held()
}

func run(fns []func()) {
	for _, f := range fns {
		f()
	}
}
