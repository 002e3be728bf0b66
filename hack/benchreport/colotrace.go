package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// coloTrace is what a primary QEMU's log, written with the trace events
// colo_compare_tcp_miscompare, colo_compare_old_packet and colo_compare_crossed (VMTIER_TRACE,
// VMTIER_LOGS), says of why colo-compare forced the checkpoints it forced between two times: each
// TCP comparison that failed, by kind (mismatchKind), each packet that waited past the compare
// timeout, by its side and kind (packetKind), and each time both guests' data waited crossed.
type coloTrace struct {
	// Mismatches counts the distinct failed comparisons (one pair of packets is compared again at
	// each packet that arrives until the checkpoint) by kind.
	Mismatches map[string]int
	// SameRangeSizes counts the payload sizes of the same-range mismatches: a size that repeats
	// names the reply that differs (a 34-byte SMTP "250 ... queued as ID").
	SameRangeSizes map[int]int
	// Timeouts counts the packets that forced a checkpoint on the timeout, by side and kind.
	Timeouts map[timedOut]int
	// Crossed counts the times the two guests' data waited crossed (QEMU patch 16), by how many
	// connections held each side's data.
	Crossed map[crossedWait]int
}

// crossedWait is one time data of the primary waited on Primary connections and the
// secondary's on Secondary (not the same one), each longer than colo-compare's x-crossed-timeout.
type crossedWait struct{ Primary, Secondary int }

// timedOut is a packet that waited past the compare timeout: its side ("primary", "secondary")
// and its kind (packetKind: "data", "FIN", "bare ACK"...).
type timedOut struct{ Side, Kind string }

const (
	sameRange   = "same bytes of the stream, different payload"
	otherCut    = "cut differently, different payload where they overlap"
	ackAhead    = "cut differently, the primary acknowledged what the secondary had not"
	behind      = "the secondary's segment starts before the primary's: bytes already released"
	aheadOfPrim = "the secondary's segment starts after the primary's"
)

// mismatchKinds are the kinds of failed comparison, in the report's order.
var mismatchKinds = []string{sameRange, otherCut, ackAhead, behind, aheadOfPrim}

// parseColoTrace reads the trace lines of r whose timestamps fall in [from, to) (zero: no bound).
func parseColoTrace(r io.Reader, from, to time.Time) (coloTrace, error) {
	t := coloTrace{Mismatches: map[string]int{}, SameRangeSizes: map[int]int{}, Timeouts: map[timedOut]int{}, Crossed: map[crossedWait]int{}}
	seen := map[string]bool{}
	var lastCrossed time.Time
	err := eachTraceLine(r, from, to, 3, func(at time.Time, f []string, line string) error {
		switch f[1] {
		case "colo_compare_tcp_miscompare":
			// pri seq/end/ack= A/B/C offset= N sec seq/end/ack= D/E/F offset= M min_ack= G
			if len(f) != 14 {
				return fmt.Errorf("colo_compare_tcp_miscompare: %d fields in %q", len(f), line)
			}
			key := f[4] + " " + f[9]
			if seen[key] {
				return nil
			}
			seen[key] = true
			p, err1 := seqEndAck(f[4])
			s, err2 := seqEndAck(f[9])
			minAck, err3 := strconv.ParseUint(f[13], 10, 32)
			pOff, err4 := strconv.ParseUint(f[6], 10, 16)
			sOff, err5 := strconv.ParseUint(f[11], 10, 16)
			if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
				return fmt.Errorf("%q: %w", line, err)
			}
			kind := mismatchKind(p, s, uint32(pOff), uint32(sOff), uint32(minAck))
			t.Mismatches[kind]++
			if kind == sameRange {
				t.SameRangeSizes[int(p[1]-p[0])]++
			}
		case "colo_compare_old_packet":
			// primary: proto= 6 seq/ack= A/B pdlen= N flags=F age= MS ms
			if len(f) < 10 {
				return fmt.Errorf("colo_compare_old_packet: %d fields in %q", len(f), line)
			}
			t.Timeouts[timedOut{strings.TrimSuffix(f[2], ":"), packetKind(f[8], strings.TrimPrefix(f[9], "flags="))}]++
		case "colo_compare_crossed":
			// data waits over W ms: the primary's on P connections, the secondary's on S
			if len(f) != 16 {
				return fmt.Errorf("colo_compare_crossed: %d fields in %q", len(f), line)
			}
			wait, err1 := strconv.Atoi(f[5])
			p, err2 := strconv.Atoi(f[10])
			s, err3 := strconv.Atoi(f[15])
			if err := errors.Join(err1, err2, err3); err != nil {
				return fmt.Errorf("%q: %w", line, err)
			}
			// colo-compare traces the wait at each scan until the checkpoint starts; after a
			// checkpoint data must wait the whole W again, so lines closer than W are one wait.
			if lastCrossed.IsZero() || at.Sub(lastCrossed) >= time.Duration(wait)*time.Millisecond {
				t.Crossed[crossedWait{p, s}]++
			}
			lastCrossed = at
		}
		return nil
	})
	return t, err
}

// mismatchKind says why colo-compare's comparison of the primary's segment p with the secondary's
// s (each seq, end, ack; compared from their offsets) failed.
func mismatchKind(p, s [3]uint32, pOff, sOff, minAck uint32) string {
	pAt, sAt := p[0]+pOff, s[0]+sOff
	switch {
	case p[0] == s[0] && p[1] == s[1]:
		return sameRange
	case seqAfter(pAt, sAt):
		return behind
	case seqAfter(sAt, pAt):
		return aheadOfPrim
	case !seqAfter(p[1], s[1]) && seqAfter(p[2], minAck):
		return ackAhead
	}
	return otherCut
}

// packetKind names a TCP packet by its payload length and flags (decimal, as the trace gives them).
func packetKind(pdlen, flags string) string {
	fl, err := strconv.Atoi(flags)
	switch {
	case err != nil:
		return "packet (flags " + flags + ")"
	case pdlen != "0":
		return "data"
	case fl&0x04 != 0:
		return "RST"
	case fl&0x02 != 0:
		return "SYN"
	case fl&0x01 != 0:
		return "FIN"
	}
	return "bare ACK"
}

func seqEndAck(s string) ([3]uint32, error) {
	var v [3]uint32
	parts := strings.Split(s, "/")
	if len(parts) != 3 {
		return v, fmt.Errorf("%q is not seq/end/ack", s)
	}
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return v, err
		}
		v[i] = uint32(n)
	}
	return v, nil
}

// seqAfter is TCP's after(): a comes later than b in sequence space.
func seqAfter(a, b uint32) bool { return int32(b-a) < 0 }

func coloTraceReport(w io.Writer, path string, from, to time.Time) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	t, err := parseColoTrace(f, from, to)
	if err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("| forced on | why | count |\n| --- | --- | ---: |\n")
	for _, kind := range mismatchKinds {
		fmt.Fprintf(&b, "| mismatch | %s | %d |\n", kind, t.Mismatches[kind])
	}
	timeouts := slices.SortedFunc(maps.Keys(t.Timeouts), func(a, b timedOut) int {
		return cmp.Or(cmp.Compare(a.Side, b.Side), cmp.Compare(a.Kind, b.Kind))
	})
	for _, k := range timeouts {
		fmt.Fprintf(&b, "| timeout | the %s's %s waited for its counterpart | %d |\n", k.Side, k.Kind, t.Timeouts[k])
	}
	crossed := slices.SortedFunc(maps.Keys(t.Crossed), func(a, b crossedWait) int {
		return cmp.Or(cmp.Compare(a.Primary, b.Primary), cmp.Compare(a.Secondary, b.Secondary))
	})
	for _, k := range crossed {
		fmt.Fprintf(&b, "| crossed wait | the primary's data waited on %d connections, the secondary's on %d | %d |\n", k.Primary, k.Secondary, t.Crossed[k])
	}
	sizes := slices.SortedFunc(maps.Keys(t.SameRangeSizes), func(a, b int) int {
		return cmp.Or(cmp.Compare(t.SameRangeSizes[b], t.SameRangeSizes[a]), cmp.Compare(a, b)) // the most frequent first, then the smallest
	})
	if len(sizes) > 0 {
		b.WriteString("\nsame-range mismatches by payload size:")
		for _, n := range sizes[:min(len(sizes), 8)] {
			fmt.Fprintf(&b, " %d bytes x%d;", n, t.SameRangeSizes[n])
		}
		b.WriteString("\n")
	}
	_, err = io.WriteString(w, b.String())
	return err
}
