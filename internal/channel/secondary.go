package channel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/lockstep-dev/lockstep/internal/ftlog"
)

// Secondary receives the log, applies each entry exactly once and in order, acknowledges, and
// watches the primary's silence.
type Secondary struct {
	cfg Config
	// Apply applies an entry to the replica VM; the entry is acknowledged once Apply returns nil.
	// An error ends the connection (the entry is asked for again on the next one).
	Apply func(ftlog.Entry) error
	// OnResign, when set, is called with the reason when the primary resigns (ftlog.Resign): it
	// stopped running the VM. It is called from the connection's reader and must not block.
	OnResign func(reason string)
	// OnSynchronized, when set, is called (without blocking) when the secondary becomes
	// Synchronized: it applied its first entry of a primary of the newest epoch it admitted.
	OnSynchronized func()
	// Witness, when set, says when the last renewal of the pair's record for the primary that
	// went through began (zero: none); each new one is passed on to a primary that speaks
	// version 2 (ftlog.Renewed). It must not block.
	Witness func() time.Time

	// applyMu serializes applying entries across connections: a connection being replaced may
	// still be applying one when its successor asks where to resume.
	applyMu sync.Mutex

	mu    sync.Mutex
	rep   *ftlog.Replica
	epoch uint64 // highest primary epoch seen: an older primary is refused
	// appliedEpoch is the newest epoch of a primary one of whose entries was applied.
	appliedEpoch uint64
	lastHeard    time.Time
	current      net.Conn
	closed       bool
	logID        uint64 // the primary's log the replica follows
	stats        SecondaryStats
}

// SecondaryStats are the secondary's counters.
type SecondaryStats struct {
	Applied     uint64
	Connections uint64
	Refused     uint64
	// Logs counts the primary's logs followed (a new one per new primary, or per restart).
	Logs      uint64
	Connected bool
	LastHeard time.Time
}

// NewSecondary makes the secondary's side.
func NewSecondary(cfg Config, apply func(ftlog.Entry) error) *Secondary {
	return &Secondary{cfg: cfg.withDefaults(), Apply: apply, rep: ftlog.NewReplica(), lastHeard: time.Now()}
}

// Silence is how long the primary has said nothing, across connections: the secondary's failure
// detector compares it with its timeout before it asks the Lease to go live.
func (s *Secondary) Silence(now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return now.Sub(s.lastHeard)
}

// Stats returns the counters.
func (s *Secondary) Stats() SecondaryStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Applied, st.Connected, st.LastHeard = s.rep.Next()-1, s.current != nil, s.lastHeard
	return st
}

// WatchSilence calls lost once the primary has been silent for longer than timeout, checking
// every heartbeat; it returns when lost was called or ctx ended.
func (s *Secondary) WatchSilence(ctx context.Context, timeout time.Duration, lost func(silence time.Duration)) {
	t := time.NewTicker(s.cfg.Heartbeat / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if d := s.Silence(now); d > timeout {
				lost(d)
				return
			}
		}
	}
}

// Serve accepts the primary's connections on ln until ctx ends. A new connection replaces the
// current one: a primary that reconnects must not wait for the old connection to time out.
func (s *Secondary) Serve(ctx context.Context, ln net.Listener) error {
	return ServeConns(ctx, ln, func(raw net.Conn) { _ = s.session(ctx, raw) })
}

// ServeConns accepts connections on ln until ctx ends, handling each on its own goroutine, and waits
// for the handlers before it returns.
func ServeConns(ctx context.Context, ln net.Listener, handle func(net.Conn)) error {
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		raw, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			handle(raw)
		}()
	}
}

func (s *Secondary) session(ctx context.Context, raw net.Conn) error {
	c, peer, stop, err := accept(ctx, raw, s.cfg.TLS, s.cfg.Timeout)
	if err != nil {
		return err
	}
	defer stop()
	return s.serveConn(ctx, c, peer)
}

// accept runs the server side of the TLS handshake and reads the primary's Hello.
func accept(ctx context.Context, raw net.Conn, tc *tls.Config, timeout time.Duration) (*conn, *ftlog.Hello, func(), error) {
	c, stop, err := handshake(ctx, tls.Server(raw, logServerTLS(tc)), timeout)
	if err != nil {
		return nil, nil, nil, err
	}
	f, err := c.read(timeout)
	if err == nil && (f.Type != ftlog.FrameHello || f.Hello.Role != ftlog.RolePrimary) {
		err = fmt.Errorf("%w: the first frame is not a primary's Hello", ErrHandshake)
	}
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	return c, f.Hello, stop, nil
}

// serveConn runs an accepted connection whose Hello was read.
func (s *Secondary) serveConn(ctx context.Context, c *conn, peer *ftlog.Hello) error {
	if peer.Pair != s.cfg.Pair {
		return s.refuse(fmt.Errorf("%w: peer serves pair %q, not %q", ErrHandshake, peer.Pair, s.cfg.Pair))
	}
	hello, err := s.admit(c, peer)
	if err != nil {
		return s.refuse(err)
	}
	defer func() {
		s.mu.Lock()
		if s.current == c {
			s.current = nil
		}
		s.mu.Unlock()
	}()
	// The lower of the two versions is spoken.
	hello.Version = min(ftlog.Version, peer.Version)
	if err := c.write(ftlog.Frame{Type: ftlog.FrameHello, Hello: &hello}); err != nil {
		return err
	}

	errs := make(chan error, 2)
	acks := make(chan struct{}, 1)
	go func() { errs <- s.readLoop(c, acks) }()
	go func() { errs <- s.writeLoop(ctx, c, acks, hello.Version >= 2) }()
	err = <-errs
	_ = c.Close()
	<-errs
	return err
}

// Synchronized says whether the secondary holds the state of the newest primary epoch it
// admitted: it applied an entry that a primary of that epoch logged. A primary takes a new epoch
// when it claims the pair against its secondary, and from then on releases outputs that the
// secondary never saw; a secondary that only heard its Hello since holds an older state, and may
// neither claim the pair nor be promoted until it applied the new log's first entry (the whole
// state).
func (s *Secondary) Synchronized() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.appliedEpoch > 0 && s.appliedEpoch >= s.epoch
}

// Epoch is the newest primary epoch this secondary has admitted.
func (s *Secondary) Epoch() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch
}

// Close ends the current connection and refuses the primary from now on (this side goes live or
// is fenced: it must apply nothing more).
func (s *Secondary) Close() {
	s.mu.Lock()
	s.closed = true
	if s.current != nil {
		_ = s.current.Close()
	}
	s.mu.Unlock()
	// Wait for an entry being applied: the engine may run as the primary once Close returns.
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
}

// admit makes c the current connection of a primary that may speak, and returns the Hello that
// tells it where to resume. An entry that the connection it replaces is still applying is either
// counted in the resume point or arrives again and is skipped: applying is serialized by applyMu.
func (s *Secondary) admit(c *conn, peer *ftlog.Hello) (ftlog.Hello, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ftlog.Hello{}, fmt.Errorf("%w: this secondary no longer follows a primary", ErrHandshake)
	}
	if peer.Epoch < s.epoch {
		return ftlog.Hello{}, fmt.Errorf("%w: primary of epoch %d, but epoch %d was seen: a fenced primary", ErrHandshake, peer.Epoch, s.epoch)
	}
	s.epoch = peer.Epoch
	c.epoch = peer.Epoch
	if peer.Log != s.logID {
		// A new log starts with the whole state: the replica starts over.
		s.logID, s.rep = peer.Log, ftlog.NewReplica()
		s.stats.Logs++
	}
	if s.current != nil {
		_ = s.current.Close() // the primary reconnected: the old connection is dead to it
	}
	s.current = c
	s.stats.Connections++
	s.lastHeard = time.Now()
	return ftlog.Hello{Role: ftlog.RoleSecondary, Epoch: s.epoch, Next: s.rep.Next(), Pair: s.cfg.Pair}, nil
}

func (s *Secondary) refuse(err error) error {
	s.mu.Lock()
	s.stats.Refused++
	s.mu.Unlock()
	return err
}

// readLoop applies entries; after each frame it signals the writer to acknowledge.
func (s *Secondary) readLoop(c *conn, acks chan<- struct{}) error {
	for {
		f, err := c.read(s.cfg.Timeout)
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.lastHeard = time.Now()
		s.mu.Unlock()
		switch f.Type {
		case ftlog.FrameHeartbeat:
			continue
		case ftlog.FrameResign:
			if s.OnResign != nil {
				s.OnResign(f.Resign.Reason)
			}
			return ErrResigned
		case ftlog.FrameEntries:
		default:
			return fmt.Errorf("%w: unexpected %s from the primary", ftlog.ErrProtocol, f.Type)
		}
		if err := s.applyAll(c, f.Entries); err != nil {
			return err
		}
		select {
		case acks <- struct{}{}:
		default: // an acknowledgement is already due; it will be cumulative
		}
	}
}

// applyAll applies the entries not applied yet, each exactly once.
func (s *Secondary) applyAll(c *conn, entries []ftlog.Entry) error {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	for _, e := range entries {
		s.mu.Lock()
		ok, err := s.rep.Check(e)
		if s.closed || s.current != c {
			// Closed, or replaced by a connection that may follow another log.
			err = errors.New("the connection is no longer the secondary's current one")
		}
		s.mu.Unlock()
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if err := s.Apply(e); err != nil {
			return fmt.Errorf("applying entry %d: %w", e.Seq, err)
		}
		s.mu.Lock()
		s.rep.Applied(e)
		synchronized := c.epoch > s.appliedEpoch && c.epoch == s.epoch
		s.appliedEpoch = max(s.appliedEpoch, c.epoch)
		s.mu.Unlock()
		if synchronized && s.OnSynchronized != nil {
			s.OnSynchronized()
		}
	}
	return nil
}

// writeLoop sends acknowledgements as entries are applied, and heartbeats.
func (s *Secondary) writeLoop(ctx context.Context, c *conn, acks <-chan struct{}, renewals bool) error {
	hb := time.NewTicker(s.cfg.Heartbeat)
	defer hb.Stop()
	var told time.Time // the last renewal passed on, on this connection
	for {
		select {
		case <-acks:
			s.mu.Lock()
			a := s.rep.Ack()
			s.mu.Unlock()
			if err := c.write(ftlog.Frame{Type: ftlog.FrameAck, Ack: &a}); err != nil {
				return err
			}
		case <-hb.C:
			s.mu.Lock()
			last := s.rep.Next() - 1
			s.mu.Unlock()
			if err := c.write(ftlog.Frame{Type: ftlog.FrameHeartbeat, Heartbeat: &ftlog.Heartbeat{SentUnixNano: time.Now().UnixNano(), Last: last}}); err != nil {
				return err
			}
			if !renewals || s.Witness == nil {
				continue
			}
			if w := s.Witness(); w.After(told) {
				if err := c.write(ftlog.Frame{Type: ftlog.FrameRenewed, Renewed: &ftlog.Renewed{Ago: time.Since(w)}}); err != nil {
					return err
				}
				told = w
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
