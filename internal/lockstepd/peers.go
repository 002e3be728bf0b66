package lockstepd

import (
	"context"
	"fmt"
	"sync"

	"github.com/lockstep-dev/lockstep/internal/agent"
)

// peers is which node each member of this node pairs with, as the API says: the FT log and the
// streams of a pair are served only to the node that holds the pair's other member.
type peers struct {
	mu     sync.Mutex
	byPair map[string]map[string]string // pair → member VMI → peer node
}

func (p *peers) set(pair, vmi, node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if node == "" {
		delete(p.byPair[pair], vmi)
		if len(p.byPair[pair]) == 0 {
			delete(p.byPair, pair)
		}
		return
	}
	if p.byPair == nil {
		p.byPair = map[string]map[string]string{}
	}
	if p.byPair[pair] == nil {
		p.byPair[pair] = map[string]string{}
	}
	p.byPair[pair][vmi] = node
}

// authorize accepts node's lockstepd for pair if a member of the pair here pairs with it.
func (p *peers) authorize(pair, node string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range p.byPair[pair] {
		if n == node {
			return nil
		}
	}
	return fmt.Errorf("lockstepd of node %s is not the peer of any member of %s on this node", node, pair)
}

// SetPeer tells the member's agent where the other member is, and lets that member's node, and
// no other, reach this member's FT log and streams.
func (m *Member) SetPeer(ctx context.Context, p agent.Peer) {
	m.peers.set(m.Spec.Pair, m.Spec.VMI, p.Node)
	m.Agent.SetPeer(ctx, p)
}
