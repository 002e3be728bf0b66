package main

import (
	"strings"
	"testing"
	"time"
)

// Two exchanges of 8 KiB as the members' logs trace them (QEMU 10.2.2's events; the times are
// made up): the request in two receive buffers and a tail, a bare ACK before it on the primary,
// the reply as a two-buffer transmit request, a one-buffer one (a bare ACK) that is no reply, and
// a disk request (both kinds of buffer) on a queue of its own. The second exchange has no match.
const pingPongPrimary = `2026-11-28T12:00:00.000000Z virtqueue_pop vq 0xrx elem 0x1 in_num 1 out_num 0
2026-11-28T12:00:00.000010Z virtqueue_fill vq 0xrx elem 0x1 len 78 idx 0
2026-11-28T12:00:00.000100Z virtqueue_fill vq 0xrx elem 0x2 len 4096 idx 0
2026-11-28T12:00:00.000110Z virtqueue_fill vq 0xrx elem 0x3 len 4096 idx 1
2026-11-28T12:00:00.000120Z virtqueue_fill vq 0xrx elem 0x4 len 78 idx 2
2026-11-28T12:00:00.000200Z virtqueue_pop vq 0xblk elem 0x9 in_num 1 out_num 1
2026-11-28T12:00:00.000300Z virtqueue_pop vq 0xtx elem 0x5 in_num 0 out_num 1
2026-11-28T12:00:00.000500Z virtqueue_pop vq 0xtx elem 0x6 in_num 0 out_num 2
2026-11-28T12:00:00.000600Z colo_compare_main : packet same and release packet
2026-11-28T12:00:00.001000Z colo_compare_tcp_info pri: seq/ack= 1/2 hdlen= 78 pdlen= 8192 offset= 0 flags=24
2026-11-28T12:00:00.001010Z colo_compare_tcp_info sec: seq/ack= 1/2 hdlen= 78 pdlen= 8192 offset= 0 flags=24
2026-11-28T12:00:00.001020Z colo_compare_main : packet same and release packet
2026-11-28T12:00:00.001300Z virtqueue_pop vq 0xrx elem 0x7 in_num 1 out_num 0
2026-11-28T12:00:00.001300Z virtqueue_fill vq 0xrx elem 0x7 len 4096 idx 0
2026-11-28T12:00:00.001310Z virtqueue_fill vq 0xrx elem 0x8 len 4096 idx 1
2026-11-28T12:00:00.001800Z virtqueue_pop vq 0xtx elem 0x6 in_num 0 out_num 2
`

const pingPongSecondary = `2026-11-28T12:00:00.000300Z virtqueue_pop vq 0xsrx elem 0x1 in_num 1 out_num 0
2026-11-28T12:00:00.000300Z virtqueue_fill vq 0xsrx elem 0x1 len 4096 idx 0
2026-11-28T12:00:00.000310Z virtqueue_fill vq 0xsrx elem 0x2 len 4096 idx 1
2026-11-28T12:00:00.000800Z virtqueue_pop vq 0xstx elem 0x3 in_num 0 out_num 2
2026-11-28T12:00:00.001500Z virtqueue_pop vq 0xsrx elem 0x4 in_num 1 out_num 0
2026-11-28T12:00:00.001500Z virtqueue_fill vq 0xsrx elem 0x4 len 4096 idx 0
`

func TestPingPongExchanges(t *testing.T) {
	read := func(s string) []traceLine {
		lines, err := readTraceLines(strings.NewReader(s), time.Time{}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return lines
	}
	at := func(us int) time.Time { return time.Date(2026, 11, 28, 12, 0, 0, us*1000, time.UTC) }
	xs := exchanges(read(pingPongPrimary), read(pingPongSecondary))
	want := []exchange{
		{primaryRequest: at(100), secondaryRequest: at(300), primaryReply: at(500), secondaryReply: at(800), match: at(1000), release: at(1020)},
		{primaryRequest: at(1300), secondaryRequest: at(1500), primaryReply: at(1800)},
	}
	if len(xs) != len(want) {
		t.Fatalf("%d exchanges, want %d: %+v", len(xs), len(want), xs)
	}
	for i := range want {
		if xs[i] != want[i] {
			t.Errorf("exchange %d: got %+v, want %+v", i, xs[i], want[i])
		}
	}
	if !xs[0].complete() || xs[1].complete() {
		t.Errorf("complete: %v and %v, want true and false", xs[0].complete(), xs[1].complete())
	}
}
