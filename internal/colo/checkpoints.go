package colo

import (
	"encoding/binary"
	"strconv"
	"sync"
	"time"
)

// The messages the secondary sends back to the primary (qapi COLOMessage: checkpoint-ready,
// checkpoint-reply, vmstate-received, vmstate-loaded), each a big-endian 32-bit word on the
// migration stream's return path. (The primary's own messages, 1, 3 and 4, go the other way.)
const (
	msgCheckpointReady = 0
	msgCheckpointReply = 2
	msgVMStateReceived = 5
	msgVMStateLoaded   = 6
)

// Checkpoint is one completed checkpoint as the primary's node saw it.
type Checkpoint struct {
	// N counts the pair's checkpoints from 1.
	N uint64
	// Pause is how long the primary's VM stood still: from the secondary's reply to the request
	// (the primary stops its VM on it) to the secondary's report that it received the whole
	// state (lockstep's QEMU resumes the primary on it: hack/qemu/colo-resume-on-state-received.patch).
	// It covers stopping the VM, saving the state and sending it.
	Pause time.Duration
	// Load is how long the secondary then took to load the state (its RAM cache flushed into the
	// VM, its disk's checkpoint taken), while the primary ran again: from its report of the state
	// received to its report of the state loaded. The next checkpoint cannot begin before it.
	Load time.Duration
	// Interval is the time since the previous checkpoint ended (zero for the first).
	Interval time.Duration
	// Committed is when the secondary reported the state received: from then on colo-compare
	// releases the packets the primary produced before the checkpoint. This is COLO's output
	// commit point, the counterpart of the FT log's acknowledgement.
	Committed time.Time
	At        time.Time
}

// Forced says whether colo-compare asked for checkpoint cp before the periodic one was due every
// period (x-checkpoint-delay): the two sides' packets differed, or the secondary's came later
// than the compare timeout. QEMU says neither which nor why, so a checkpoint that follows the
// previous one by less than nine tenths of the period counts as forced (QEMU's timer runs from
// a little before the previous checkpoint ended). The first checkpoint counts as periodic.
func Forced(cp Checkpoint, period time.Duration) bool {
	return cp.Interval > 0 && period > 0 && cp.Interval < period*9/10
}

// Checkpoints reads the messages the secondary sends back on the migration stream (COLO's return
// path, which carries nothing else) and times the checkpoints. It is fed the bytes in order, in
// pieces of any size.
type Checkpoints struct {
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// OnReady is called when the secondary loaded the VM's whole state and entered COLO; OnCheckpoint
	// after every checkpoint. Both are called on the feeding goroutine.
	OnReady      func()
	OnCheckpoint func(Checkpoint)

	mu        sync.Mutex
	word      [4]byte
	have      int
	ready     bool
	n         uint64
	replyAt   time.Time
	committed time.Time
	lastEnd   time.Time
	err       error
}

// Observe feeds bytes of the return path.
func (c *Checkpoints) Observe(b []byte) {
	for len(b) > 0 {
		k := copy(c.word[c.have:], b)
		c.have += k
		b = b[k:]
		if c.have < 4 {
			return
		}
		c.have = 0
		c.message(binary.BigEndian.Uint32(c.word[:]))
	}
}

func (c *Checkpoints) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Checkpoints) message(m uint32) {
	now := c.now()
	c.mu.Lock()
	var ready func()
	var done *Checkpoint
	switch m {
	case msgCheckpointReady:
		if !c.ready {
			c.ready, ready = true, c.OnReady
		}
	case msgCheckpointReply:
		c.replyAt = now
	case msgVMStateReceived:
		c.committed = now
	case msgVMStateLoaded:
		c.n++
		cp := Checkpoint{N: c.n, Pause: c.committed.Sub(c.replyAt), Load: now.Sub(c.committed), Committed: c.committed, At: now}
		if !c.lastEnd.IsZero() {
			cp.Interval = now.Sub(c.lastEnd)
		}
		c.lastEnd = now
		done = &cp
	default:
		// The secondary sends nothing else: the stream is not what it should be. Keep the first
		// such word for the engine's report and go on counting what can be counted.
		if c.err == nil {
			c.err = &unexpectedMessage{m}
		}
	}
	cb := c.OnCheckpoint
	c.mu.Unlock()
	if ready != nil {
		ready()
	}
	if done != nil && cb != nil {
		cb(*done)
	}
}

// Ready reports whether the secondary entered COLO; Err the first unexpected word, if any.
func (c *Checkpoints) Ready() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ready
}

func (c *Checkpoints) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

type unexpectedMessage struct{ m uint32 }

func (u *unexpectedMessage) Error() string {
	return "unexpected COLO message on the return path: " + strconv.FormatUint(uint64(u.m), 10)
}
