package ftlog

import (
	"errors"
	"fmt"
	"time"
)

// Window bounds the entries the primary keeps unacknowledged: flow control. When it is full the
// primary waits (paper 2.4: the primary cannot run ahead of a slow secondary without bound).
type Window struct {
	Entries int
	Bytes   int
}

// ErrWindowFull is returned by Append when the window is full; wait for an acknowledgement.
var ErrWindowFull = errors.New("log window full: the secondary has not acknowledged enough entries")

// ErrCannotResume is returned when a reconnecting secondary needs entries the primary no longer
// holds (it acknowledged them before and lost them): only a full resynchronisation helps then.
var ErrCannotResume = errors.New("cannot resume the log")

// ErrProtocol is wrapped by errors of a peer that breaks the protocol.
var ErrProtocol = errors.New("log protocol violation")

// Log is the primary's side of the FT log: it numbers entries, keeps each one until the secondary
// acknowledges it (so that a new connection can resend it), and tracks which ones were sent on the
// current connection.
type Log struct {
	window  Window
	last    uint64  // last appended
	acked   uint64  // cumulative acknowledgement
	sent    uint64  // last sent on the current connection
	pending []Entry // acked+1 .. last
	bytes   int
}

// NewLog makes an empty log; the first entry is 1. A zero bound takes DefaultWindow's.
func NewLog(w Window) *Log {
	if w.Entries <= 0 {
		w.Entries = DefaultWindow.Entries
	}
	if w.Bytes <= 0 {
		w.Bytes = DefaultWindow.Bytes
	}
	return &Log{window: w}
}

// DefaultWindow is about a second of heavy logging at the paper's 950 Mbit/s.
var DefaultWindow = Window{Entries: 65536, Bytes: 128 << 20}

// Append adds an entry and returns its sequence number.
func (l *Log) Append(data []byte, now time.Time) (uint64, error) {
	if len(l.pending) >= l.window.Entries || (len(l.pending) > 0 && l.bytes+len(data) > l.window.Bytes) {
		return 0, ErrWindowFull
	}
	l.last++
	l.pending = append(l.pending, Entry{Seq: l.last, SentUnixNano: now.UnixNano(), Data: data})
	l.bytes += len(data)
	return l.last, nil
}

// Last is the last appended entry: the log position an output produced now follows.
func (l *Log) Last() uint64 { return l.last }

// Acked is the last entry the secondary acknowledged.
func (l *Log) Acked() uint64 { return l.acked }

// Unacked is the number of entries waiting for an acknowledgement.
func (l *Log) Unacked() int { return len(l.pending) }

// Next returns up to maxEntries entries (and about maxBytes, at least one entry) not yet sent on
// this connection, and marks them sent.
func (l *Log) Next(maxEntries, maxBytes int) []Entry {
	start := int(l.sent - l.acked) // index of the first unsent entry
	if start >= len(l.pending) {
		return nil
	}
	end, size := start, 0
	for end < len(l.pending) && end-start < maxEntries && (end == start || size+len(l.pending[end].Data) <= maxBytes) {
		size += len(l.pending[end].Data)
		end++
	}
	out := l.pending[start:end:end]
	l.sent = out[len(out)-1].Seq
	return out
}

// Ack applies a cumulative acknowledgement. It returns the vLockstep lag it measures (how long
// entry a.Seq took from being logged to being acknowledged; 0 for a stale ack) and an ErrProtocol
// for an acknowledgement of entries that were never sent.
func (l *Log) Ack(a Ack, now time.Time) (time.Duration, error) {
	if a.Seq > l.sent {
		return 0, fmt.Errorf("%w: ack of %d, but only up to %d was sent", ErrProtocol, a.Seq, l.sent)
	}
	if a.Seq <= l.acked {
		return 0, nil // a late duplicate
	}
	l.release(a.Seq)
	return now.Sub(time.Unix(0, a.EchoUnixNano)), nil
}

func (l *Log) release(upTo uint64) {
	n := int(upTo - l.acked)
	for i := range l.pending[:n] {
		l.bytes -= len(l.pending[i].Data)
		l.pending[i] = Entry{} // let the data go
	}
	// Reslice rather than copy: append reallocates once the capacity runs out, so the cost is
	// amortized, and batches handed out by Next stay valid.
	l.pending = l.pending[n:]
	l.acked = upTo
}

// Resume starts a new connection with a secondary whose first unapplied entry is next: entries
// before it are acknowledged (the secondary applied them; their acks were lost with the old
// connection), and sending restarts at next.
func (l *Log) Resume(next uint64) error {
	switch {
	case next == 0:
		return fmt.Errorf("%w: the secondary expects entry 0", ErrProtocol)
	case next <= l.acked:
		return fmt.Errorf("%w: the secondary needs entry %d, but entries up to %d were acknowledged and dropped", ErrCannotResume, next, l.acked)
	case next > l.last+1:
		return fmt.Errorf("%w: the secondary expects entry %d, but the primary logged only up to %d", ErrProtocol, next, l.last)
	}
	l.release(next - 1)
	l.sent = next - 1
	return nil
}

// Replica is the secondary's side: it applies entries exactly once and in order.
type Replica struct {
	next     uint64 // first entry not yet applied
	lastSent int64  // SentUnixNano of the last applied entry
}

// NewReplica makes a replica that expects entry 1 first.
func NewReplica() *Replica { return &Replica{next: 1} }

// Next is the first entry the replica has not applied: what it asks for when it reconnects.
func (r *Replica) Next() uint64 { return r.next }

// Accept says whether to apply e, and records it applied: false for an entry already applied (a
// resend after a reconnection), and an ErrProtocol for a gap.
func (r *Replica) Accept(e Entry) (bool, error) {
	ok, err := r.Check(e)
	if ok {
		r.Applied(e)
	}
	return ok, err
}

// Check says whether e is the next entry to apply (true), one already applied (false), or beyond
// a gap (an ErrProtocol). Call Applied once it is applied.
func (r *Replica) Check(e Entry) (bool, error) {
	switch {
	case e.Seq < r.next:
		return false, nil
	case e.Seq > r.next:
		return false, fmt.Errorf("%w: entry %d arrived, %d expected", ErrProtocol, e.Seq, r.next)
	}
	return true, nil
}

// Applied records that the entry Check accepted was applied.
func (r *Replica) Applied(e Entry) {
	r.next = e.Seq + 1
	r.lastSent = e.SentUnixNano
}

// Ack acknowledges everything applied so far.
func (r *Replica) Ack() Ack { return Ack{Seq: r.next - 1, EchoUnixNano: r.lastSent} }
