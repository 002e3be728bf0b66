package channel

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"time"

	"github.com/lockstep-dev/lockstep/internal/nodecert"
)

// Mux serves the secondaries of every pair on one node from one listener: lockstepd listens once
// on the logging network, and each primary's Hello names the pair its connection is for.
type Mux struct {
	// TLS is the node's server configuration (its certificate and the CA it trusts).
	TLS *tls.Config
	// Timeout bounds the handshake and the wait for the Hello.
	Timeout time.Duration
	// Authorize, when set, decides whether the peer's node may serve the pair its Hello names.
	Authorize nodecert.Authorizer

	mu   sync.Mutex
	byID map[string]*Secondary
	// Unknown counts connections for a pair that has no secondary here.
	unknown uint64
	// refused counts connections whose peer Authorize refused.
	refused uint64
}

// Register routes the pair's connections to s, replacing a previous secondary of the pair.
func (m *Mux) Register(pair string, s *Secondary) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byID == nil {
		m.byID = map[string]*Secondary{}
	}
	m.byID[pair] = s
}

// Unregister stops routing the pair's connections to s (if s is still the pair's secondary).
func (m *Mux) Unregister(pair string, s *Secondary) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byID[pair] == s {
		delete(m.byID, pair)
	}
}

// Unknown is the number of connections refused because their pair has no secondary here.
func (m *Mux) Unknown() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.unknown
}

// Refused is the number of connections refused because their peer is not the pair's other node.
func (m *Mux) Refused() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.refused
}

// Serve accepts connections on ln until ctx ends.
func (m *Mux) Serve(ctx context.Context, ln net.Listener) error {
	timeout := m.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return ServeConns(ctx, ln, func(raw net.Conn) {
		c, peer, stopConn, err := accept(ctx, raw, m.TLS, timeout)
		if err != nil {
			return
		}
		defer stopConn()
		if err := m.Authorize.Check(c.Conn.(*tls.Conn).ConnectionState(), peer.Pair); err != nil {
			m.mu.Lock()
			m.refused++
			m.mu.Unlock()
			return // the primary sees the connection end before a Hello
		}
		m.mu.Lock()
		s := m.byID[peer.Pair]
		if s == nil {
			m.unknown++
		}
		m.mu.Unlock()
		if s != nil {
			_ = s.serveConn(ctx, c, peer)
		}
	})
}
