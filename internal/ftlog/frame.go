// Package ftlog is the FT log protocol between a primary and its secondary (white paper 2.2-2.4):
// framed, sequenced log entries sent in batches, cumulative acknowledgements, heartbeats, and
// the handshake that resumes a broken connection from the last acknowledged entry. It has no
// Kubernetes and no I/O beyond the io.Reader/io.Writer it is given, so that it is tested directly.
//
// Wire format: every frame is
//
//	type (1 byte) | length of the body (uint32, big endian) | body
//
// and the bodies are, in big endian:
//
//	Hello      version u8 | role u8 | epoch u64 | log u64 | next u64 | pair (rest, UTF-8)
//	Entries    first u64 | count u32 | count x (sentUnixNano i64 | len u32 | data)
//	Ack        seq u64 | echoUnixNano i64
//	Heartbeat  sentUnixNano i64 | last u64
//	Resign     reason (rest, UTF-8)
//	Renewed    agoNanos u64                                   (version 2)
//
// A body is at most MaxFrameBody bytes. Sequence numbers start at 1; 0 means "none yet".
//
// Versions: each side's Hello carries the highest version it speaks, and a side accepts any
// version from MinVersion on; the two speak the lower of the two. A secondary sends Renewed only
// to a primary whose Hello said 2 or more. A version 1 side refuses a Hello of another version;
// a primary learns which version its secondary speaks before its Hello, from the TLS application
// protocol the secondary names (internal/channel): "lockstep-ftlog/2", or none at version 1.
//
// Renewed is the secondary's word that it renewed the pair's record for its primary (internal/
// term): a renewal of the record that went through began agoNanos before the frame was sent.
// With it, a primary cut from the API server but not from its secondary keeps its term.
//
// Resign is the primary's last frame when it stops running the VM (its VM died, or it was
// fenced): the secondary need not wait out the detection timeout before it claims the pair. A
// peer that predates it ends the connection on the unknown type and detects the silence as
// before, so it needs no new protocol version.
package ftlog

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// FrameType says what a frame carries.
type FrameType uint8

const (
	FrameHello     FrameType = 1
	FrameEntries   FrameType = 2
	FrameAck       FrameType = 3
	FrameHeartbeat FrameType = 4
	FrameResign    FrameType = 5
	FrameRenewed   FrameType = 6
)

func (t FrameType) String() string {
	switch t {
	case FrameHello:
		return "Hello"
	case FrameEntries:
		return "Entries"
	case FrameAck:
		return "Ack"
	case FrameHeartbeat:
		return "Heartbeat"
	case FrameResign:
		return "Resign"
	case FrameRenewed:
		return "Renewed"
	}
	return fmt.Sprintf("FrameType(%d)", uint8(t))
}

// Version is the highest protocol version this side speaks, which its Hello carries; MinVersion
// the lowest it accepts.
const (
	Version    = 2
	MinVersion = 1
)

// MaxFrameBody bounds a frame body, so that a corrupt or hostile length cannot make the reader
// allocate without limit.
const MaxFrameBody = 16 << 20

const headerLen = 5

// Role is the side of the channel.
type Role uint8

const (
	RolePrimary   Role = 1
	RoleSecondary Role = 2
)

// Entry is one log entry: the primary's record of a non-deterministic event or input.
type Entry struct {
	Seq uint64
	// SentUnixNano is when the primary logged it; the secondary's acknowledgement echoes it so
	// that the primary measures how far the secondary trails (the vLockstep interval).
	SentUnixNano int64
	Data         []byte
}

// Hello opens a connection. The secondary's Next is the first entry it has not applied, so that
// the primary resends from there; the primary's Next is the first entry it still holds.
type Hello struct {
	// Version is the highest version the sender speaks (0 when encoding: Version).
	Version uint8
	Role    Role
	Epoch   uint64
	// Log identifies the primary's log: a primary that starts a new log (for a new secondary, or
	// after the secondary lost entries it had acknowledged) begins it with the whole VM state, and
	// a secondary that sees a new Log starts its replica over from entry 1.
	Log  uint64
	Next uint64
	Pair string
}

// Ack acknowledges every entry up to and including Seq. EchoUnixNano is the SentUnixNano of
// entry Seq.
type Ack struct {
	Seq          uint64
	EchoUnixNano int64
}

// Heartbeat proves the sender is alive; Last is the last entry it sent (primary) or applied
// (secondary).
type Heartbeat struct {
	SentUnixNano int64
	Last         uint64
}

// Renewed says that a renewal of the pair's record for the primary, which went through, began Ago
// before the frame was sent.
type Renewed struct {
	Ago time.Duration
}

// Resign says the primary stopped running the VM, and why.
type Resign struct {
	Reason string
}

// Frame is one decoded frame: exactly one of its fields is set, as Type says.
type Frame struct {
	Type      FrameType
	Hello     *Hello
	Entries   []Entry
	Ack       *Ack
	Heartbeat *Heartbeat
	Resign    *Resign
	Renewed   *Renewed
}

// ErrFrame is wrapped by every decoding error of a malformed frame.
var ErrFrame = errors.New("malformed frame")

func frameErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrFrame, fmt.Sprintf(format, args...))
}

// AppendFrame appends the encoding of f to b.
func AppendFrame(b []byte, f Frame) ([]byte, error) {
	start := len(b)
	b = append(b, byte(f.Type), 0, 0, 0, 0)
	switch f.Type {
	case FrameHello:
		h := f.Hello
		v := h.Version
		if v == 0 {
			v = Version
		}
		b = append(b, v, byte(h.Role))
		b = binary.BigEndian.AppendUint64(b, h.Epoch)
		b = binary.BigEndian.AppendUint64(b, h.Log)
		b = binary.BigEndian.AppendUint64(b, h.Next)
		b = append(b, h.Pair...)
	case FrameEntries:
		if len(f.Entries) == 0 {
			return nil, errors.New("an Entries frame needs at least one entry")
		}
		b = binary.BigEndian.AppendUint64(b, f.Entries[0].Seq)
		b = binary.BigEndian.AppendUint32(b, uint32(len(f.Entries)))
		for i, e := range f.Entries {
			if e.Seq != f.Entries[0].Seq+uint64(i) {
				return nil, fmt.Errorf("entries must be consecutive: %d after %d", e.Seq, f.Entries[0].Seq)
			}
			b = binary.BigEndian.AppendUint64(b, uint64(e.SentUnixNano))
			b = binary.BigEndian.AppendUint32(b, uint32(len(e.Data)))
			b = append(b, e.Data...)
		}
	case FrameAck:
		b = binary.BigEndian.AppendUint64(b, f.Ack.Seq)
		b = binary.BigEndian.AppendUint64(b, uint64(f.Ack.EchoUnixNano))
	case FrameHeartbeat:
		b = binary.BigEndian.AppendUint64(b, uint64(f.Heartbeat.SentUnixNano))
		b = binary.BigEndian.AppendUint64(b, f.Heartbeat.Last)
	case FrameResign:
		b = append(b, f.Resign.Reason...)
	case FrameRenewed:
		b = binary.BigEndian.AppendUint64(b, uint64(max(f.Renewed.Ago, 0)))
	default:
		return nil, fmt.Errorf("unknown frame type %d", f.Type)
	}
	body := len(b) - start - headerLen
	if body > MaxFrameBody {
		return nil, fmt.Errorf("frame body of %d bytes exceeds %d", body, MaxFrameBody)
	}
	binary.BigEndian.PutUint32(b[start+1:], uint32(body))
	return b, nil
}

// ReadFrame reads one frame. It returns io.EOF only at a clean frame boundary, and an ErrFrame
// for anything malformed. Entry data points into a buffer of its own that the caller may keep.
func ReadFrame(r *bufio.Reader) (Frame, error) {
	var hdr [headerLen]byte
	if _, err := io.ReadFull(r, hdr[:1]); err != nil {
		return Frame{}, err
	}
	if _, err := io.ReadFull(r, hdr[1:]); err != nil {
		return Frame{}, unexpectedEOF(err)
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFrameBody {
		return Frame{}, frameErr("body of %d bytes exceeds %d", n, MaxFrameBody)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return Frame{}, unexpectedEOF(err)
	}
	return DecodeBody(FrameType(hdr[0]), body)
}

func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// DecodeBody decodes a frame body of the given type. Entry data aliases body.
func DecodeBody(t FrameType, body []byte) (Frame, error) {
	d := decoder{b: body}
	f := Frame{Type: t}
	switch t {
	case FrameHello:
		v := d.u8()
		h := &Hello{Role: Role(d.u8()), Epoch: d.u64(), Log: d.u64(), Next: d.u64()}
		if d.err != nil {
			return Frame{}, d.err
		}
		if v < MinVersion {
			return Frame{}, frameErr("protocol version %d, want %d or more", v, MinVersion)
		}
		h.Version = v
		if h.Role != RolePrimary && h.Role != RoleSecondary {
			return Frame{}, frameErr("unknown role %d", h.Role)
		}
		h.Pair = string(d.rest())
		f.Hello = h
	case FrameEntries:
		first, count := d.u64(), d.u32()
		if d.err != nil {
			return Frame{}, d.err
		}
		if count == 0 {
			return Frame{}, frameErr("no entries")
		}
		// Each entry takes at least 12 bytes: a count the body cannot hold is a lie.
		if uint64(count)*12 > uint64(len(d.b)) {
			return Frame{}, frameErr("%d entries cannot fit in %d bytes", count, len(d.b))
		}
		if first == 0 || first+uint64(count)-1 < first {
			return Frame{}, frameErr("bad sequence range %d+%d", first, count)
		}
		f.Entries = make([]Entry, 0, count)
		for i := range uint64(count) {
			e := Entry{Seq: first + i, SentUnixNano: int64(d.u64())}
			n := d.u32()
			e.Data = d.bytes(n)
			if d.err != nil {
				return Frame{}, d.err
			}
			f.Entries = append(f.Entries, e)
		}
	case FrameAck:
		f.Ack = &Ack{Seq: d.u64(), EchoUnixNano: int64(d.u64())}
	case FrameHeartbeat:
		f.Heartbeat = &Heartbeat{SentUnixNano: int64(d.u64()), Last: d.u64()}
	case FrameResign:
		f.Resign = &Resign{Reason: string(d.rest())}
	case FrameRenewed:
		f.Renewed = &Renewed{Ago: time.Duration(d.u64())}
		if f.Renewed.Ago < 0 {
			return Frame{}, frameErr("a renewal %d ns ago", int64(f.Renewed.Ago))
		}
	default:
		return Frame{}, frameErr("unknown frame type %d", t)
	}
	if d.err != nil {
		return Frame{}, d.err
	}
	if len(d.b) != 0 {
		return Frame{}, frameErr("%d trailing bytes in %s", len(d.b), t)
	}
	return f, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) need(n uint64) bool {
	if d.err != nil {
		return false
	}
	if uint64(len(d.b)) < n {
		d.err = frameErr("truncated body: need %d bytes, have %d", n, len(d.b))
		return false
	}
	return true
}

func (d *decoder) u8() uint8 {
	if !d.need(1) {
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) u32() uint32 {
	if !d.need(4) {
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *decoder) u64() uint64 {
	if !d.need(8) {
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

// bytes returns the next n bytes; they alias the body, which ReadFrame allocates for each frame.
func (d *decoder) bytes(n uint32) []byte {
	if !d.need(uint64(n)) {
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) rest() []byte {
	v := d.b
	d.b = nil
	return v
}
