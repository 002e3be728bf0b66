package ftlog

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
	"time"
)

func roundTrip(t *testing.T, f Frame) Frame {
	t.Helper()
	b, err := AppendFrame(nil, f)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadFrame(bufio.NewReader(bytes.NewReader(b)))
	if err != nil {
		t.Fatalf("%s: %v", f.Type, err)
	}
	return got
}

func TestFramesRoundTrip(t *testing.T) {
	for _, f := range []Frame{
		{Type: FrameHello, Hello: &Hello{Version: Version, Role: RoleSecondary, Epoch: 7, Log: 0xfeedbeef, Next: 42, Pair: "ns/mail-01"}},
		{Type: FrameHello, Hello: &Hello{Version: 1, Role: RolePrimary, Epoch: 7, Pair: "ns/mail-01"}}, // a peer of version 1
		{Type: FrameHello, Hello: &Hello{Version: 9, Role: RolePrimary, Epoch: 7, Pair: "ns/mail-01"}}, // a newer one: the lower version is spoken
		{Type: FrameRenewed, Renewed: &Renewed{Ago: 1500 * time.Millisecond}},
		{Type: FrameRenewed, Renewed: &Renewed{}},
		{Type: FrameEntries, Entries: []Entry{{Seq: 5, SentUnixNano: 1, Data: []byte("a")}, {Seq: 6, SentUnixNano: -2, Data: []byte{}}, {Seq: 7, Data: bytes.Repeat([]byte{9}, 1000)}}},
		{Type: FrameAck, Ack: &Ack{Seq: 1 << 40, EchoUnixNano: 123}},
		{Type: FrameHeartbeat, Heartbeat: &Heartbeat{SentUnixNano: 99, Last: 3}},
		{Type: FrameResign, Resign: &Resign{Reason: "the VM engine stopped: QEMU exited"}},
		{Type: FrameResign, Resign: &Resign{}},
	} {
		got := roundTrip(t, f)
		if f.Type == FrameEntries { // nil and empty data are the same on the wire
			for i := range f.Entries {
				if len(f.Entries[i].Data) == 0 {
					f.Entries[i].Data, got.Entries[i].Data = nil, nil
				}
			}
		}
		if !reflect.DeepEqual(got, f) {
			t.Errorf("%s: got %+v, want %+v", f.Type, got, f)
		}
	}
}

func TestReadFrameRejectsMalformedInput(t *testing.T) {
	good, _ := AppendFrame(nil, Frame{Type: FrameEntries, Entries: []Entry{{Seq: 1, Data: []byte("xyz")}}})
	for name, in := range map[string][]byte{
		"unknown type":          {99, 0, 0, 0, 0},
		"huge length":           {byte(FrameAck), 0xff, 0xff, 0xff, 0xff},
		"truncated ack":         {byte(FrameAck), 0, 0, 0, 3, 1, 2, 3},
		"trailing bytes":        append([]byte{byte(FrameHeartbeat), 0, 0, 0, 17}, make([]byte, 17)...),
		"lying entry count":     {byte(FrameEntries), 0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff},
		"sequence zero":         append([]byte{byte(FrameEntries), 0, 0, 0, 24}, append(make([]byte, 8), 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)...),
		"entry data too long":   append(append([]byte{}, good[:len(good)-3]...), 0xff),
		"bad version":           append([]byte{byte(FrameHello), 0, 0, 0, 18, 0, 1}, make([]byte, 16)...),
		"renewed in the future": {byte(FrameRenewed), 0, 0, 0, 8, 0xff, 0, 0, 0, 0, 0, 0, 0},
		"bad role":              append([]byte{byte(FrameHello), 0, 0, 0, 18, Version, 7}, make([]byte, 16)...),
	} {
		_, err := ReadFrame(bufio.NewReader(bytes.NewReader(in)))
		if !errors.Is(err, ErrFrame) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%s: want a malformed-frame error, got %v", name, err)
		}
	}
	// A clean end of stream is io.EOF; a cut inside a frame is io.ErrUnexpectedEOF.
	if _, err := ReadFrame(bufio.NewReader(bytes.NewReader(nil))); err != io.EOF {
		t.Errorf("empty stream: %v", err)
	}
	if _, err := ReadFrame(bufio.NewReader(bytes.NewReader(good[:7]))); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut frame: %v", err)
	}
}

func TestAppendFrameRefusesNonConsecutiveEntries(t *testing.T) {
	if _, err := AppendFrame(nil, Frame{Type: FrameEntries, Entries: []Entry{{Seq: 1}, {Seq: 3}}}); err == nil {
		t.Fatal("a gap inside a batch must be refused")
	}
	if _, err := AppendFrame(nil, Frame{Type: FrameEntries}); err == nil {
		t.Fatal("an empty batch must be refused")
	}
}

// FuzzReadFrame: no input makes the decoder panic or allocate without bound, and whatever it
// accepts encodes back to the same bytes.
func FuzzReadFrame(f *testing.F) {
	for _, fr := range []Frame{
		{Type: FrameHello, Hello: &Hello{Role: RolePrimary, Epoch: 1, Next: 1, Pair: "p"}},
		{Type: FrameEntries, Entries: []Entry{{Seq: 1, SentUnixNano: 5, Data: []byte("hello")}, {Seq: 2}}},
		{Type: FrameAck, Ack: &Ack{Seq: 2, EchoUnixNano: 5}},
		{Type: FrameHeartbeat, Heartbeat: &Heartbeat{SentUnixNano: 1, Last: 2}},
		{Type: FrameResign, Resign: &Resign{Reason: "fenced"}},
	} {
		b, _ := AppendFrame(nil, fr)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bufio.NewReader(bytes.NewReader(in))
		var out []byte
		for {
			fr, err := ReadFrame(r)
			if err != nil {
				break
			}
			out, err = AppendFrame(out, fr)
			if err != nil {
				t.Fatalf("decoded %+v but cannot encode it: %v", fr, err)
			}
		}
		if !bytes.HasPrefix(in, out) {
			t.Fatalf("re-encoding differs:\n in  %x\n out %x", in, out)
		}
	})
}
