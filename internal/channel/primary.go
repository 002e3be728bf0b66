package channel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/lockstep-dev/lockstep/internal/ftlog"
	"github.com/lockstep-dev/lockstep/internal/nodecert"
)

// Primary streams the log to the secondary, reconnecting and resuming until its context ends.
type Primary struct {
	cfg   Config
	addr  string
	epoch uint64
	logID uint64
	// Dial opens the TCP connection (a test or a fault proxy may replace it).
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// OnAck, when set, is called with every new cumulative acknowledgement, in order, from the
	// connection's reader; it must not block (the output gate's Ack is meant to be called here).
	OnAck func(seq uint64)
	// Pacer, when set, slows Append while the secondary trails (paper 1.3).
	Pacer *ftlog.Pacer
	// OnRenewed, when set, is called from the connection's reader when the secondary says it
	// renewed the pair's record for this primary (ftlog.Renewed), with when that renewal began at
	// the latest, on this side's clock: the frame's own "ago", less the longest a frame can have
	// waited on the way (the timeout: a connection silent for longer is dropped). It must not
	// block.
	OnRenewed func(began time.Time)

	mu        sync.Mutex
	changed   chan struct{} // closed and replaced on every change of the log
	log       *ftlog.Log
	interval  ftlog.Interval
	connected bool
	delivered uint64 // the last acknowledgement OnAck has returned from
	lastHeard time.Time
	stats     PrimaryStats
	fatal     error
	resign    *ftlog.Resign // set by Resign: the writer's last frame
	resigned  chan struct{} // closed once the Resign frame was written: no session starts again
}

// PrimaryStats are the primary's counters.
type PrimaryStats struct {
	Last, Acked      uint64
	Interval         time.Duration
	PaceDelay        time.Duration
	BytesLogged      uint64
	Connections      uint64
	Connected        bool
	LastHeard        time.Time
	LastAckUnixNanos int64
}

// NewPrimary makes the primary's side for the secondary at addr, with a new log; epoch is the
// pair's Lease epoch this primary holds. The first entry of a new log must carry the whole VM
// state: the secondary starts its replica over when it sees a new log.
func NewPrimary(cfg Config, addr string, epoch uint64) *Primary {
	cfg = cfg.withDefaults()
	return &Primary{
		cfg: cfg, addr: addr, epoch: epoch, logID: rand.Uint64() | 1,
		Dial: func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		},
		changed:  make(chan struct{}),
		resigned: make(chan struct{}),
		log:      ftlog.NewLog(cfg.Window),
	}
}

// notify wakes everyone waiting on a change; the caller holds mu.
func (p *Primary) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Append logs an entry (the data is copied) and returns its sequence number: the position that
// every output produced from now on follows. It waits while the window is full.
func (p *Primary) Append(ctx context.Context, data []byte) (uint64, error) {
	data = append([]byte(nil), data...)
	for {
		p.mu.Lock()
		if p.fatal != nil {
			err := p.fatal
			p.mu.Unlock()
			return 0, err
		}
		delay := time.Duration(0)
		if p.Pacer != nil {
			delay = p.Pacer.Delay()
		}
		seq, err := p.log.Append(data, time.Now())
		if err == nil {
			p.stats.BytesLogged += uint64(len(data))
			p.notify()
			p.mu.Unlock()
			if delay > 0 {
				if err := sleep(ctx, delay); err != nil {
					return seq, err
				}
			}
			return seq, nil
		}
		wait := p.changed
		p.mu.Unlock()
		if !errors.Is(err, ftlog.ErrWindowFull) {
			return 0, err
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// Last is the last logged entry.
func (p *Primary) Last() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.Last()
}

// WaitAcked waits until the secondary has acknowledged entry seq and OnAck has been told.
func (p *Primary) WaitAcked(ctx context.Context, seq uint64) error {
	for {
		p.mu.Lock()
		acked, wait, fatal := p.delivered, p.changed, p.fatal
		p.mu.Unlock()
		if acked >= seq {
			return nil
		}
		if fatal != nil {
			return fatal
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Stats returns the counters.
func (p *Primary) Stats() PrimaryStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Last, s.Acked, s.Interval = p.log.Last(), p.log.Acked(), p.interval.Value()
	s.Connected, s.LastHeard = p.connected, p.lastHeard
	if p.Pacer != nil {
		s.PaceDelay = p.Pacer.Delay()
	}
	return s
}

// ErrStopped is returned by Append and WaitAcked once Run has returned: the log goes nowhere.
var ErrStopped = errors.New("the primary's channel stopped")

// Run connects, streams and reconnects until ctx ends or the log cannot be resumed (the
// secondary lost entries it had acknowledged: only a new secondary helps then). Once it returns,
// Append and WaitAcked fail (with ErrStopped, or with the reason the log could not go on), so
// that nobody waits for room in a window that will never drain.
func (p *Primary) Run(ctx context.Context) (err error) {
	defer func() {
		p.mu.Lock()
		if p.fatal == nil {
			p.fatal = fmt.Errorf("%w: %v", ErrStopped, err)
		}
		p.notify()
		p.mu.Unlock()
	}()
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		err := p.session(ctx)
		select {
		case <-p.resigned:
			err = ErrResigned // whichever of the session's loops ended it first
		default:
		}
		if errors.Is(err, ftlog.ErrCannotResume) || errors.Is(err, ftlog.ErrProtocol) || errors.Is(err, ErrResigned) {
			p.mu.Lock()
			p.fatal = err
			p.mu.Unlock()
			return err
		}
		if err := sleep(ctx, backoff); err != nil {
			break
		}
		backoff = min(2*backoff, p.cfg.Heartbeat)
	}
	return ctx.Err()
}

// session runs one connection to its end.
func (p *Primary) session(ctx context.Context) error {
	dialCtx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	raw, err := p.Dial(dialCtx, p.addr)
	cancel()
	if err != nil {
		return err
	}
	c, stop, err := handshake(ctx, tls.Client(raw, logClientTLS(nodecert.Expect(p.cfg.TLS, p.cfg.PeerNode))), p.cfg.Timeout)
	if err != nil {
		return err
	}
	defer stop()

	p.mu.Lock()
	hello := ftlog.Hello{Version: helloVersion(c), Role: ftlog.RolePrimary, Epoch: p.epoch, Log: p.logID, Next: p.log.Acked() + 1, Pair: p.cfg.Pair}
	p.mu.Unlock()
	if err := c.write(ftlog.Frame{Type: ftlog.FrameHello, Hello: &hello}); err != nil {
		return err
	}
	f, err := c.read(p.cfg.Timeout)
	if err != nil {
		return err
	}
	peer, err := expectHello(f, ftlog.RoleSecondary, p.cfg.Pair)
	if err != nil {
		return err
	}
	p.mu.Lock()
	err = p.log.Resume(peer.Next)
	if err == nil {
		p.connected = true
		p.lastHeard = time.Now()
		p.stats.Connections++
		p.notify()
	}
	p.mu.Unlock()
	if err != nil {
		return err
	}
	defer func() {
		p.mu.Lock()
		p.connected = false
		p.notify()
		p.mu.Unlock()
	}()

	errs := make(chan error, 2)
	go func() { errs <- p.readLoop(c) }()
	go func() { errs <- p.writeLoop(ctx, c) }()
	err = <-errs
	_ = c.Close() // ends the other loop
	<-errs
	return err
}

// writeLoop sends new entries as they are logged, and a heartbeat when there is nothing to send.
func (p *Primary) writeLoop(ctx context.Context, c *conn) error {
	hb := time.NewTimer(p.cfg.Heartbeat)
	defer hb.Stop()
	for {
		p.mu.Lock()
		batch := p.log.Next(p.cfg.MaxBatchEntries, p.cfg.MaxBatchBytes)
		last, wait, resign := p.log.Last(), p.changed, p.resign
		p.mu.Unlock()
		if resign != nil {
			if err := c.write(ftlog.Frame{Type: ftlog.FrameResign, Resign: resign}); err != nil {
				return err
			}
			close(p.resigned)
			return ErrResigned
		}
		if len(batch) > 0 {
			if err := c.write(ftlog.Frame{Type: ftlog.FrameEntries, Entries: batch}); err != nil {
				return err
			}
			hb.Reset(p.cfg.Heartbeat)
			continue
		}
		select {
		case <-wait:
		case <-hb.C:
			if err := c.write(ftlog.Frame{Type: ftlog.FrameHeartbeat, Heartbeat: &ftlog.Heartbeat{SentUnixNano: time.Now().UnixNano(), Last: last}}); err != nil {
				return err
			}
			hb.Reset(p.cfg.Heartbeat)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Resign tells the secondary that this primary stopped running the VM, and why, so that it claims
// the pair at once instead of after its detection timeout. It waits until the frame is written,
// for at most the channel's timeout or until ctx ends, and the log ends with it. It reports
// whether the secondary was told: without a connection it cannot be, and detects the silence.
func (p *Primary) Resign(ctx context.Context, reason string) bool {
	p.mu.Lock()
	connected := p.connected
	if p.resign == nil {
		p.resign = &ftlog.Resign{Reason: reason}
		p.notify()
	}
	p.mu.Unlock()
	if !connected {
		return false
	}
	t := time.NewTimer(p.cfg.Timeout)
	defer t.Stop()
	select {
	case <-p.resigned:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// readLoop takes acknowledgements and heartbeats; silence beyond the timeout ends the connection.
func (p *Primary) readLoop(c *conn) error {
	for {
		f, err := c.read(p.cfg.Timeout)
		if err != nil {
			return err
		}
		now := time.Now()
		p.mu.Lock()
		p.lastHeard = now
		var newAck uint64
		if f.Type == ftlog.FrameAck {
			before := p.log.Acked()
			lag, err := p.log.Ack(*f.Ack, now)
			if err != nil {
				p.mu.Unlock()
				return err
			}
			if p.log.Acked() > before {
				newAck = p.log.Acked()
				p.interval.Observe(lag)
				p.stats.LastAckUnixNanos = now.UnixNano()
				if p.Pacer != nil {
					p.Pacer.Update(p.interval.Value(), now)
				}
				p.notify()
			}
		} else if f.Type == ftlog.FrameRenewed {
			if p.OnRenewed != nil {
				began := now.Add(-f.Renewed.Ago - p.cfg.Timeout)
				p.mu.Unlock()
				p.OnRenewed(began) // outside mu: the agent's handler takes its own lock
				continue
			}
		} else if f.Type != ftlog.FrameHeartbeat {
			p.mu.Unlock()
			return fmt.Errorf("%w: unexpected %s from the secondary", ftlog.ErrProtocol, f.Type)
		}
		p.mu.Unlock()
		if newAck == 0 {
			continue
		}
		if p.OnAck != nil {
			p.OnAck(newAck)
		}
		p.mu.Lock()
		p.delivered = newAck
		p.notify()
		p.mu.Unlock()
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
