package main

import (
	"maps"
	"strings"
	"testing"
	"time"
)

// Lines as the primary's QEMU log has them (trace events with -msg timestamp=on), from a run of
// make bench-workloads' transmit and mail rows.
const coloTraceSample = `2026-11-27T16:53:31.304580Z colo_compare_old_packet primary: proto= 6 seq/ack= 3827132049/1633492045 pdlen= 41 flags=24 age= 123 ms
2026-11-27T16:53:33.665920Z colo_compare_tcp_miscompare pri seq/end/ack= 723552861/723555757/1339470563 offset= 0 sec seq/end/ack= 723551413/723562997/1339470563 offset= 1448 min_ack= 1339470563
2026-11-27T16:53:33.666265Z colo_compare_tcp_miscompare pri seq/end/ack= 723552861/723555757/1339470563 offset= 0 sec seq/end/ack= 723551413/723562997/1339470563 offset= 1448 min_ack= 1339470563
2026-11-27T16:53:34.185236Z colo_compare_tcp_miscompare pri seq/end/ack= 724055317/724058213/1339470563 offset= 0 sec seq/end/ack= 724055317/724058213/1339470563 offset= 0 min_ack= 1339470563
qemu-system-x86_64: some other line
2026-11-27T16:54:00.168416Z colo_compare_tcp_miscompare pri seq/end/ack= 1310329563/1310329597/1681197270 offset= 0 sec seq/end/ack= 1310329563/1310329597/1681197270 offset= 0 min_ack= 1681197270
2026-11-27T16:54:00.200000Z colo_compare_tcp_miscompare pri seq/end/ack= 3827134938/3827134966/1633495389 offset= 0 sec seq/end/ack= 3827134838/3827134938/1633495081 offset= 0 min_ack= 1633495081
2026-11-27T16:54:01.000000Z colo_compare_tcp_miscompare pri seq/end/ack= 100/200/5 offset= 0 sec seq/end/ack= 100/250/4294967290 offset= 0 min_ack= 4294967290
2026-11-27T16:54:02.000000Z colo_compare_tcp_miscompare pri seq/end/ack= 10/20/1 offset= 0 sec seq/end/ack= 15/30/1 offset= 0 min_ack= 1
2026-11-27T16:54:07.065306Z colo_compare_old_packet primary: proto= 6 seq/ack= 2754486670/3757196345 pdlen= 0 flags=17 age= 113 ms
2026-11-27T16:54:07.215880Z colo_compare_old_packet primary: proto= 6 seq/ack= 2754486671/3757196346 pdlen= 0 flags=16 age= 123 ms
2026-11-27T16:54:08.000000Z colo_compare_old_packet secondary: proto= 6 seq/ack= 1/2 pdlen= 15 flags=25 age= 101 ms
2026-11-27T16:54:09.000000Z colo_compare_crossed data waits over 20 ms: the primary's on 1 connections, the secondary's on 1
2026-11-27T16:54:09.012000Z colo_compare_crossed data waits over 20 ms: the primary's on 1 connections, the secondary's on 1
2026-11-27T16:54:09.050000Z colo_compare_crossed data waits over 20 ms: the primary's on 1 connections, the secondary's on 1
2026-11-27T16:54:10.000000Z colo_compare_crossed data waits over 20 ms: the primary's on 2 connections, the secondary's on 1
`

func TestParseColoTrace(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		name         string
		from, to     time.Time
		want         map[string]int
		wantSizes    map[int]int
		wantTimeouts map[timedOut]int
		wantCrossed  map[crossedWait]int
	}{
		{
			name: "every line",
			// The pair compared twice counts once; the secondary's segment at 1448 of its
			// payload starts where the primary's does; an acknowledgement across the wrap of
			// the sequence space (5 after 4294967290) is ahead; a crossed wait traced again
			// within its 20 ms is the same wait, one 38 ms after it another.
			want:         map[string]int{sameRange: 2, otherCut: 1, ackAhead: 1, behind: 1, aheadOfPrim: 1},
			wantSizes:    map[int]int{2896: 1, 34: 1},
			wantTimeouts: map[timedOut]int{{"primary", "data"}: 1, {"primary", "FIN"}: 1, {"primary", "bare ACK"}: 1, {"secondary", "data"}: 1},
			wantCrossed:  map[crossedWait]int{{1, 1}: 2, {2, 1}: 1},
		},
		{
			name: "a window", from: at("2026-11-27T16:53:34Z"), to: at("2026-11-27T16:54:07Z"),
			want:         map[string]int{sameRange: 2, ackAhead: 1, behind: 1, aheadOfPrim: 1},
			wantSizes:    map[int]int{2896: 1, 34: 1},
			wantTimeouts: map[timedOut]int{},
			wantCrossed:  map[crossedWait]int{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseColoTrace(strings.NewReader(coloTraceSample), tc.from, tc.to)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got.Mismatches, tc.want) {
				t.Errorf("mismatches: got %v, want %v", got.Mismatches, tc.want)
			}
			if !maps.Equal(got.SameRangeSizes, tc.wantSizes) {
				t.Errorf("same-range sizes: got %v, want %v", got.SameRangeSizes, tc.wantSizes)
			}
			if !maps.Equal(got.Timeouts, tc.wantTimeouts) {
				t.Errorf("timeouts: got %v, want %v", got.Timeouts, tc.wantTimeouts)
			}
			if !maps.Equal(got.Crossed, tc.wantCrossed) {
				t.Errorf("crossed waits: got %v, want %v", got.Crossed, tc.wantCrossed)
			}
		})
	}
}

func TestParseColoTraceRefusesAMangledLine(t *testing.T) {
	for _, line := range []string{
		"2026-11-27T16:54:00Z colo_compare_tcp_miscompare pri seq/end/ack= 1/2 offset= 0",
		"2026-11-27T16:54:00Z colo_compare_old_packet primary: proto= 6 seq/ack= 1/2 pdlen= 0", // no flags
		"2026-11-27T16:54:00Z colo_compare_crossed data waits over 20 ms: the primary's on 1 connections",
		"2026-11-27T16:54:00Z colo_compare_crossed data waits over x ms: the primary's on 1 connections, the secondary's on 1",
	} {
		if _, err := parseColoTrace(strings.NewReader(line+"\n"), time.Time{}, time.Time{}); err == nil {
			t.Errorf("%q was read", line)
		}
	}
}
