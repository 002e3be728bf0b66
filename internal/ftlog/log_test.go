package ftlog

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// link is one connection: frames in flight each way, through the real encoder and decoder.
type link struct {
	toSecondary, toPrimary bytes.Buffer
}

func send(t *testing.T, buf *bytes.Buffer, f Frame) {
	b, err := AppendFrame(nil, f)
	if err != nil {
		t.Fatal(err)
	}
	buf.Write(b)
}

// receive reads up to n whole frames.
func receive(t *testing.T, buf *bytes.Buffer, n int) []Frame {
	var out []Frame
	r := bufio.NewReader(bytes.NewReader(buf.Bytes()))
	consumed := 0
	for range n {
		f, err := ReadFrame(r)
		if err != nil {
			break
		}
		b, _ := AppendFrame(nil, f)
		consumed += len(b)
		out = append(out, f)
	}
	buf.Next(consumed)
	return out
}

// TestLogDeliversEverythingOnceInOrderAcrossReconnections runs a primary and a secondary over a
// connection that breaks at random (frames in flight either way are lost) and is re-established
// with the Hello handshake. The secondary must apply every entry exactly once and in order, the
// primary must never count an entry acknowledged that the secondary has not applied, and when the
// traffic stops everything is applied and acknowledged.
func TestLogDeliversEverythingOnceInOrderAcrossReconnections(t *testing.T) {
	for seed := range uint64(200) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			now := time.Unix(1000, 0)
			log := NewLog(Window{Entries: 1 + r.IntN(50), Bytes: 100 + r.IntN(2000)})
			rep := NewReplica()
			var applied [][]byte
			var appended [][]byte
			l := &link{}
			for step := range 2000 {
				now = now.Add(time.Millisecond)
				switch op := r.IntN(100); {
				case op < 40: // the VM logs an event
					data := []byte(fmt.Sprint(seed, "-", step))
					if _, err := log.Append(data, now); err == nil {
						appended = append(appended, data)
					} else if !errors.Is(err, ErrWindowFull) {
						t.Fatal(err)
					}
				case op < 60: // the primary sends a batch
					if batch := log.Next(1+r.IntN(10), 1+r.IntN(500)); len(batch) > 0 {
						send(t, &l.toSecondary, Frame{Type: FrameEntries, Entries: batch})
					}
				case op < 80: // the secondary reads what arrived and acknowledges
					for _, f := range receive(t, &l.toSecondary, 1+r.IntN(3)) {
						for _, e := range f.Entries {
							ok, err := rep.Accept(e)
							if err != nil {
								t.Fatalf("step %d: %v", step, err)
							}
							if ok {
								applied = append(applied, e.Data)
							}
						}
					}
					a := rep.Ack()
					send(t, &l.toPrimary, Frame{Type: FrameAck, Ack: &a})
				case op < 97: // the primary reads acknowledgements
					for _, f := range receive(t, &l.toPrimary, 1+r.IntN(3)) {
						if _, err := log.Ack(*f.Ack, now); err != nil {
							t.Fatalf("step %d: %v", step, err)
						}
					}
				default: // the connection breaks; a new one starts with Hello
					l = &link{}
					send(t, &l.toPrimary, Frame{Type: FrameHello, Hello: &Hello{Role: RoleSecondary, Next: rep.Next()}})
					h := receive(t, &l.toPrimary, 1)[0].Hello
					if err := log.Resume(h.Next); err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
				}
				if log.Acked() > rep.Next()-1 {
					t.Fatalf("step %d: primary counts %d acknowledged, secondary applied %d", step, log.Acked(), rep.Next()-1)
				}
				if log.Unacked() > log.window.Entries {
					t.Fatalf("step %d: %d unacknowledged entries, window %d", step, log.Unacked(), log.window.Entries)
				}
			}
			// Quiesce: a fresh connection and rounds until everything is through.
			l = &link{}
			if err := log.Resume(rep.Next()); err != nil {
				t.Fatal(err)
			}
			for log.Unacked() > 0 {
				for _, e := range log.Next(1<<30, 1<<30) {
					if ok, err := rep.Accept(e); err != nil || !ok {
						t.Fatalf("final delivery of %d: %v %v", e.Seq, ok, err)
					}
					applied = append(applied, e.Data)
				}
				if _, err := log.Ack(rep.Ack(), now); err != nil {
					t.Fatal(err)
				}
			}
			if len(applied) != len(appended) {
				t.Fatalf("applied %d entries, appended %d", len(applied), len(appended))
			}
			for i := range applied {
				if !bytes.Equal(applied[i], appended[i]) {
					t.Fatalf("entry %d: applied %q, appended %q", i+1, applied[i], appended[i])
				}
			}
		})
	}
}

func TestLogRefusesWhatThePeerCannotHaveSent(t *testing.T) {
	now := time.Unix(0, 0)
	log := NewLog(Window{Entries: 10, Bytes: 100})
	for range 3 {
		if _, err := log.Append([]byte("x"), now); err != nil {
			t.Fatal(err)
		}
	}
	log.Next(2, 100)
	if _, err := log.Ack(Ack{Seq: 3}, now); !errors.Is(err, ErrProtocol) {
		t.Errorf("ack of an unsent entry: %v", err)
	}
	lag, err := log.Ack(Ack{Seq: 2, EchoUnixNano: now.UnixNano()}, now.Add(5*time.Millisecond))
	if err != nil || lag != 5*time.Millisecond {
		t.Errorf("ack: lag %v, %v", lag, err)
	}
	if err := log.Resume(1); !errors.Is(err, ErrCannotResume) {
		t.Errorf("resume before the acknowledged entries: %v", err)
	}
	if err := log.Resume(9); !errors.Is(err, ErrProtocol) {
		t.Errorf("resume after the last entry: %v", err)
	}
	rep := NewReplica()
	if _, err := rep.Accept(Entry{Seq: 2}); !errors.Is(err, ErrProtocol) {
		t.Errorf("gap: %v", err)
	}
}

func TestWindowBoundsTheUnacknowledged(t *testing.T) {
	now := time.Unix(0, 0)
	log := NewLog(Window{Entries: 2, Bytes: 10})
	if _, err := log.Append(make([]byte, 20), now); err != nil {
		t.Fatalf("one entry larger than the byte window still goes: %v", err)
	}
	if _, err := log.Append([]byte("x"), now); !errors.Is(err, ErrWindowFull) {
		t.Fatalf("byte window: %v", err)
	}
	log.Next(10, 100)
	if _, err := log.Ack(Ack{Seq: 1}, now); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := log.Append([]byte("x"), now); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := log.Append([]byte("x"), now); !errors.Is(err, ErrWindowFull) {
		t.Fatalf("entry window: %v", err)
	}
}
