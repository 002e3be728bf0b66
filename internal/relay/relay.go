// Package relay carries a VM engine's own streams between the nodes' lockstepd: QEMU COLO's
// migration (checkpoint) stream, its NBD disk-replication stream and its two packet streams. QEMU
// reaches its node's lockstepd over Unix sockets in the member's socket directory; lockstepd
// carries each stream to the peer node over TLS 1.3 with mutual authentication, on the logging
// network, and counts its bytes. The streams thus need no port of their own on the node, never
// leave the node unencrypted, and show up in lockstepd's measure of the log bandwidth.
//
// A Forward is the side whose QEMU dials (the primary for migration and NBD, the secondary for the
// packet streams); a Server is the side whose QEMU listens. A connection opens with one line that
// names the pair and the stream, so that one Server serves every pair on a node.
package relay

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockstep-dev/lockstep/internal/channel"
	"github.com/lockstep-dev/lockstep/internal/nodecert"
)

// handshakeTimeout bounds the TLS handshake and the header line.
const handshakeTimeout = 5 * time.Second

// Counters count a stream's bytes in both directions, over all its connections.
type Counters struct {
	toPeer, fromPeer atomic.Uint64
}

// Sent is the bytes this node carried to the peer; Received the bytes it carried from the peer.
func (c *Counters) Sent() uint64     { return c.toPeer.Load() }
func (c *Counters) Received() uint64 { return c.fromPeer.Load() }

// conns tracks open connections so that they can be cut together.
type conns struct {
	mu  sync.Mutex
	set map[net.Conn]struct{}
	cut bool
}

func (cs *conns) add(c net.Conn) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.cut {
		return false
	}
	if cs.set == nil {
		cs.set = map[net.Conn]struct{}{}
	}
	cs.set[c] = struct{}{}
	return true
}

func (cs *conns) remove(c net.Conn) {
	cs.mu.Lock()
	delete(cs.set, c)
	cs.mu.Unlock()
}

func (cs *conns) cutAll() {
	cs.mu.Lock()
	cs.cut = true
	for c := range cs.set {
		_ = c.Close()
	}
	cs.mu.Unlock()
}

// Server accepts streams from peers' lockstepd and connects each to the local socket its pair's
// route names.
type Server struct {
	// TLS is the node's TLS configuration (its certificate and the CA it trusts).
	TLS *tls.Config
	// Authorize, when set, decides whether the peer's node may open a stream of the pair.
	Authorize nodecert.Authorizer

	mu      sync.Mutex
	routes  map[string]*route
	refused uint64
}

// Refused is the number of streams refused because their peer is not the pair's other node.
func (s *Server) Refused() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

type route struct {
	pair string
	path string
	*Counters
	conns conns
}

func key(member, stream string) string { return member + "\x00" + stream }

// Key is the key of the streams that a member of a pair receives ("namespace/name/vmi"): a
// Forward's Target names it, and a stream for a member that was replaced finds no route.
func Key(pair, member string) string { return pair + "/" + member }

// Route sends a stream that the pair's member receives to the Unix socket at path (where QEMU
// listens), replacing an earlier route of the stream and cutting its connections. It returns the
// stream's counters.
func (s *Server) Route(pair, member, stream, path string) *Counters {
	member = Key(pair, member)
	r := &route{pair: pair, path: path, Counters: &Counters{}}
	s.mu.Lock()
	if s.routes == nil {
		s.routes = map[string]*route{}
	}
	old := s.routes[key(member, stream)]
	s.routes[key(member, stream)] = r
	s.mu.Unlock()
	if old != nil {
		old.conns.cutAll()
	}
	return r.Counters
}

// Unroute refuses the member's stream from now on and cuts its connections.
func (s *Server) Unroute(pair, member, stream string) {
	member = Key(pair, member)
	s.mu.Lock()
	r := s.routes[key(member, stream)]
	delete(s.routes, key(member, stream))
	s.mu.Unlock()
	if r != nil {
		r.conns.cutAll()
	}
}

// Serve accepts connections on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	return channel.ServeConns(ctx, ln, func(raw net.Conn) { s.serveConn(ctx, raw) })
}

func (s *Server) serveConn(ctx context.Context, raw net.Conn) {
	bc := &batchConn{Conn: raw}
	c := tls.Server(bc, channel.ServerTLS(s.TLS))
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		_ = c.Close()
		return
	}
	member, stream, _ := strings.Cut(strings.TrimSuffix(line, "\n"), "\x00")
	s.mu.Lock()
	rt := s.routes[key(member, stream)]
	s.mu.Unlock()
	if rt == nil {
		_ = c.Close() // no such stream here (yet): the dialing QEMU retries
		return
	}
	if err := s.Authorize.Check(c.ConnectionState(), rt.pair); err != nil {
		s.mu.Lock()
		s.refused++
		s.mu.Unlock()
		_ = c.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	local, err := net.Dial("unix", rt.path)
	if err != nil {
		_ = c.Close()
		return
	}
	pipe(ctx, &rt.conns, bufferedConn{tlsBatched{c, bc}, r}, local, rt.Counters, nil)
}

// bufferedConn reads what the header's reader buffered before the rest of the connection.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// Target is where a Forward's stream goes.
type Target struct {
	// Addr is the peer lockstepd's stream address; Node its node, which the peer's certificate
	// must name ("": any certificate the CA signed).
	Addr, Node string
	// Key is the key of the peer's route for the stream (Key).
	Key string
}

func (t Target) tls(c *tls.Config) *tls.Config { return channel.ClientTLS(nodecert.Expect(c, t.Node)) }

// Owner is a user and group, by number.
type Owner struct{ UID, GID int }

// ParseOwner reads "uid:gid" (or "uid", the group the same number); "" is no one (nil).
func ParseOwner(s string) (*Owner, error) {
	if s == "" {
		return nil, nil
	}
	u, g, found := strings.Cut(s, ":")
	if !found {
		g = u
	}
	uid, err := strconv.Atoi(u)
	if err != nil || uid < 0 {
		return nil, fmt.Errorf("%q: want uid:gid, numbers", s)
	}
	gid, err := strconv.Atoi(g)
	if err != nil || gid < 0 {
		return nil, fmt.Errorf("%q: want uid:gid, numbers", s)
	}
	return &Owner{UID: uid, GID: gid}, nil
}

// Forward listens on a Unix socket for the local QEMU and carries each connection to the peer.
type Forward struct {
	Stream string
	// Path is the Unix socket QEMU connects to.
	Path string
	// Peer returns where the stream goes.
	Peer func() Target
	TLS  *tls.Config
	// Dial opens the TCP connection to the peer (default: net.Dialer).
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// FromPeer, when set, sees every byte that comes back from the peer, in order (the engine
	// reads COLO's checkpoint messages from it).
	FromPeer func([]byte)
	// Owner, when set, is given the socket: QEMU runs as another user than lockstepd (KubeVirt's
	// launcher runs it as uid 107) and must be able to connect.
	Owner *Owner
	// Once is for a stream whose QEMU side never reads again once its connection closes: QEMU's
	// filter-redirector drops its socket for good at the first disconnect, although the chardev
	// reconnects. Such a Forward keeps QEMU's connection open while the peer refuses the stream
	// (its route is not there yet: the other member has not got that far), dialling again until
	// the peer carries it; and it carries one connection only: once that ended, QEMU's next ones
	// are closed at once, so that the peer's QEMU never writes into a stream that nobody reads
	// (a filter-mirror whose socket fills stops its whole VM).
	Once bool
	Counters

	conns conns
	ended atomic.Bool // Once: a connection of QEMU's ended
}

// onceEnded is what carry sets when a Once Forward's connection ended (nil for others).
func (f *Forward) onceEnded() *atomic.Bool {
	if !f.Once {
		return nil
	}
	return &f.ended
}

// refusedRetry is how soon a Once Forward dials again after the peer refused the stream.
const refusedRetry = 200 * time.Millisecond

// Listen opens the Unix socket (replacing a stale one) and serves it until ctx ends; then every
// connection is cut.
func (f *Forward) Listen(ctx context.Context) error {
	_ = os.Remove(f.Path)
	ln, err := net.Listen("unix", f.Path)
	if err != nil {
		return fmt.Errorf("stream %s: %w", f.Stream, err)
	}
	if f.Owner != nil {
		if err := os.Chown(f.Path, f.Owner.UID, f.Owner.GID); err != nil {
			_ = ln.Close()
			return fmt.Errorf("stream %s: giving its socket to QEMU's user: %w", f.Stream, err)
		}
	}
	go func() {
		<-ctx.Done()
		_ = ln.Close()
		f.conns.cutAll()
	}()
	go func() {
		for {
			local, err := ln.Accept()
			if err != nil {
				return
			}
			go f.serveConn(ctx, local)
		}
	}()
	return nil
}

func (f *Forward) serveConn(ctx context.Context, local net.Conn) {
	if f.Once && f.ended.Load() {
		_ = local.Close()
		return
	}
	for {
		peer, err := f.open(ctx)
		if err == nil && !carry(ctx, &f.conns, peer, local, &f.Counters, f.FromPeer, f.onceEnded()) {
			return
		}
		if !f.Once {
			_ = local.Close()
			return
		}
		// Refused, or the peer is not reachable yet: nothing went either way, and QEMU's
		// connection stays open for the next attempt.
		select {
		case <-ctx.Done():
			_ = local.Close()
			f.ended.Store(true)
			return
		case <-time.After(refusedRetry):
		}
	}
}

// open dials the peer and names the stream.
func (f *Forward) open(ctx context.Context) (net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	to := f.Peer()
	raw, err := orDefault(f.Dial)(dctx, to.Addr)
	if err != nil {
		return nil, err
	}
	bc := &batchConn{Conn: raw}
	c := tls.Client(bc, to.tls(f.TLS))
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	if _, err := io.WriteString(c, to.Key+"\x00"+f.Stream+"\n"); err != nil {
		_ = c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return tlsBatched{c, bc}, nil
}

// Probe checks that the target's stream server is reachable, is the target's node and accepts
// this node's certificate, without opening a stream: a caller checks it before it makes QEMU dial
// through a Forward, so that QEMU does not block on a peer that cannot answer.
func Probe(ctx context.Context, to Target, tc *tls.Config, dial func(ctx context.Context, addr string) (net.Conn, error)) error {
	ctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	raw, err := orDefault(dial)(ctx, to.Addr)
	if err != nil {
		return err
	}
	c := tls.Client(raw, to.tls(tc))
	defer func() { _ = c.Close() }()
	return c.HandshakeContext(ctx)
}

// orDefault is dial, or TCP from the node's own network namespace.
func orDefault(dial func(ctx context.Context, addr string) (net.Conn, error)) func(ctx context.Context, addr string) (net.Conn, error) {
	if dial != nil {
		return dial
	}
	return func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
}

// pipe copies both ways between the peer's connection and the local one until either ends,
// then closes both: a COLO stream that lost one direction is lost.
func pipe(ctx context.Context, cs *conns, peer, local net.Conn, n *Counters, fromPeer func([]byte)) {
	carry(ctx, cs, peer, local, n, fromPeer, nil)
}

// carry is pipe; with once (a Once Forward's), a peer that ends the stream before a byte went
// either way refused it: carry then closes only the peer's connection, leaves the local one open
// (and unread) and reports refused. Otherwise it sets once before it closes the local
// connection, so that QEMU's next connection, which may follow the close at once, is refused.
func carry(ctx context.Context, cs *conns, peer, local net.Conn, n *Counters, fromPeer func([]byte), once *atomic.Bool) (refused bool) {
	ended := func() {
		if once != nil {
			once.Store(true)
		}
	}
	if !cs.add(peer) {
		ended()
		_ = peer.Close()
		_ = local.Close()
		return false
	}
	cs.add(local)
	defer func() {
		cs.remove(peer)
		if !refused {
			cs.remove(local)
		}
	}()
	stop := context.AfterFunc(ctx, func() { ended(); _ = peer.Close(); _ = local.Close() })
	defer stop()
	var moved atomic.Uint64 // this connection's bytes, read from QEMU or written to it
	toPeer, fromPeerDone := make(chan struct{}), make(chan struct{})
	go func() {
		copyCounting(peer, readCounting{local, &moved}, nil, &n.toPeer)
		close(toPeer)
	}()
	go func() {
		copyCounting(local, peer, fromPeer, &n.fromPeer, &moved)
		close(fromPeerDone)
	}()
	select {
	case <-toPeer:
	case <-fromPeerDone:
		if once != nil && moved.Load() == 0 {
			// Stop reading QEMU's side without closing it; refused if it gave nothing meanwhile.
			_ = peer.Close()
			_ = local.SetReadDeadline(time.Now())
			<-toPeer
			_ = local.SetReadDeadline(time.Time{})
			if moved.Load() == 0 && ctx.Err() == nil {
				return true
			}
		}
	}
	ended()
	_ = peer.Close()
	_ = local.Close()
	<-toPeer
	<-fromPeerDone
	return false
}

// readCounting counts what is read from r, written on or not.
type readCounting struct {
	r io.Reader
	n *atomic.Uint64
}

func (c readCounting) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n.Add(uint64(k))
	return k, err
}

// copyCounting copies src to dst, adding what it wrote to each of counts.
func copyCounting(dst io.Writer, src io.Reader, see func([]byte), counts ...*atomic.Uint64) {
	buf := make([]byte, 64<<10)
	for {
		k, err := src.Read(buf)
		if k > 0 {
			if see != nil {
				see(buf[:k])
			}
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return
			}
			for _, n := range counts {
				n.Add(uint64(k))
			}
		}
		if err != nil {
			return
		}
	}
}
