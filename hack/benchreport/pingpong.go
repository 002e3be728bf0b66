package main

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A ping-pong trace is what the two members' QEMU logs say of a request/response load with one
// request outstanding (the latency-bound row), traced with virtqueue_pop, virtqueue_fill,
// colo_compare_tcp_info and colo_compare_main (VMTIER_TRACE, VMTIER_LOGS): when each member's
// guest got each request from its NIC and handed its reply to it, when colo-compare matched the
// primary's reply with the secondary's, and when it released it. Both logs are of one host, so
// their times compare.

// exchange is one request and its reply, with the time of each step; zero where the trace has
// no such step.
type exchange struct {
	primaryRequest, secondaryRequest time.Time // the member's NIC gave the guest the request
	primaryReply, secondaryReply     time.Time // the member's guest gave its NIC the reply
	match, release                   time.Time // colo-compare matched the replies, released the primary's
}

func (x exchange) complete() bool {
	return !x.primaryRequest.IsZero() && !x.secondaryRequest.IsZero() && !x.primaryReply.IsZero() &&
		!x.secondaryReply.IsZero() && !x.match.IsZero() && !x.release.IsZero()
}

// slot is where x keeps the time of a step other than its primary's request.
func (x *exchange) slot(s step) *time.Time {
	switch s {
	case secondaryRequest:
		return &x.secondaryRequest
	case primaryReply:
		return &x.primaryReply
	case secondaryReply:
		return &x.secondaryReply
	case match:
		return &x.match
	}
	return &x.release
}

// dataFill is the least a receive buffer holds of a segment with data: a buffer of 128 bytes or
// less holds only headers (virtio-net's, Ethernet's, IP's and TCP's: 78 bytes with timestamps).
const dataFill = 128

type step int

const (
	primaryRequest step = iota
	secondaryRequest
	primaryReply
	secondaryReply
	match
	release
)

type stepAt struct {
	at   time.Time
	step step
}

// netQueues finds the NIC's receive and transmit virtqueues of a log: the queue most popped with
// only device-writable buffers, and the one most popped with only driver-written ones (a disk's
// requests have both).
func netQueues(lines []traceLine) (rx, tx string) {
	rxCount, txCount := map[string]int{}, map[string]int{}
	for _, l := range lines {
		// virtqueue_pop vq V elem E in_num I out_num O
		if len(l.fields) != 9 || l.fields[0] != "virtqueue_pop" {
			continue
		}
		switch in, out := l.fields[6], l.fields[8]; {
		case out == "0" && in != "0":
			rxCount[l.fields[2]]++
		case in == "0" && out != "0":
			txCount[l.fields[2]]++
		}
	}
	most := func(m map[string]int) string {
		best := ""
		for q, n := range m {
			if best == "" || n > m[best] || (n == m[best] && q < best) {
				best = q
			}
		}
		return best
	}
	return most(rxCount), most(txCount)
}

// memberSteps finds a member's requests and replies: a request begins with the first receive
// buffer holding data after one that did not or after a reply, and a reply is a transmit request
// of more than one buffer (virtio-net's header and the frame).
func memberSteps(lines []traceLine, request, reply step) []stepAt {
	rx, tx := netQueues(lines)
	var steps []stepAt
	prevData := false
	for _, l := range lines {
		f := l.fields
		switch {
		case len(f) == 9 && f[0] == "virtqueue_fill" && f[2] == rx: // virtqueue_fill vq V elem E len N idx I
			n, err := strconv.Atoi(f[6])
			data := err == nil && n > dataFill
			if data && !prevData {
				steps = append(steps, stepAt{l.at, request})
			}
			prevData = data
		case len(f) == 9 && f[0] == "virtqueue_pop" && f[2] == tx && f[8] != "1" && f[8] != "0":
			steps = append(steps, stepAt{l.at, reply})
			prevData = false // the next request's data, even with no headers-only buffer between
		}
	}
	return steps
}

// compareSteps finds colo-compare's matches of the primary's data with the secondary's, and its
// releases of what matched.
func compareSteps(lines []traceLine) []stepAt {
	var steps []stepAt
	for _, l := range lines {
		f := l.fields
		switch {
		// colo_compare_tcp_info pri: seq/ack= S/A hdlen= H pdlen= P offset= O flags=F
		case len(f) >= 8 && f[0] == "colo_compare_tcp_info" && f[1] == "pri:" && f[6] == "pdlen=" && f[7] != "0":
			steps = append(steps, stepAt{l.at, match})
		case f[0] == "colo_compare_main" && strings.Join(f[1:], " ") == ": packet same and release packet":
			steps = append(steps, stepAt{l.at, release})
		}
	}
	return steps
}

// exchanges puts the steps of both members in order of time into exchanges: each of the
// primary's requests begins one, and every other step goes to the exchange under way, once (the
// first release after the match).
func exchanges(primary, secondary []traceLine) []exchange {
	steps := slices.Concat(memberSteps(primary, primaryRequest, primaryReply),
		memberSteps(secondary, secondaryRequest, secondaryReply), compareSteps(primary))
	slices.SortStableFunc(steps, func(a, b stepAt) int { return a.at.Compare(b.at) })
	var xs []exchange
	for _, s := range steps {
		if s.step == primaryRequest {
			xs = append(xs, exchange{primaryRequest: s.at})
			continue
		}
		if len(xs) == 0 {
			continue
		}
		x := &xs[len(xs)-1]
		if slot := x.slot(s.step); slot.IsZero() && (s.step != release || !x.match.IsZero()) {
			*slot = s.at
		}
	}
	return xs
}

// pingPongSpan is one part of an exchange, measured on every complete exchange.
type pingPongSpan struct {
	name string
	// of measures it on x; next is the exchange after x (zero at the end). Negative: not there.
	of func(x, next exchange) time.Duration
}

var pingPongSpans = []pingPongSpan{
	{"the secondary gets the request after the primary (the mirror: through both lockstepds)", func(x, _ exchange) time.Duration { return x.secondaryRequest.Sub(x.primaryRequest) }},
	{"the primary's guest: request in, reply out", func(x, _ exchange) time.Duration { return x.primaryReply.Sub(x.primaryRequest) }},
	{"the secondary's guest: request in, reply out", func(x, _ exchange) time.Duration { return x.secondaryReply.Sub(x.secondaryRequest) }},
	{"colo-compare matches, after the secondary's reply left its guest (through both lockstepds)", func(x, _ exchange) time.Duration { return x.match.Sub(x.secondaryReply) }},
	{"the primary's reply waits for the match", func(x, _ exchange) time.Duration { return x.match.Sub(x.primaryReply) }},
	{"colo-compare releases it after the match", func(x, _ exchange) time.Duration { return x.release.Sub(x.match) }},
	{"the next request reaches the primary after the release (the client's side)", func(x, next exchange) time.Duration {
		if next.primaryRequest.IsZero() {
			return -1
		}
		return next.primaryRequest.Sub(x.release)
	}},
	{"the whole exchange, request to next request", func(x, next exchange) time.Duration {
		if next.primaryRequest.IsZero() {
			return -1
		}
		return next.primaryRequest.Sub(x.primaryRequest)
	}},
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64) + " ms"
}

func pingPongReport(w io.Writer, primaryLog, secondaryLog string, from, to time.Time) error {
	var lines [2][]traceLine
	for i, path := range []string{primaryLog, secondaryLog} {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		lines[i], err = readTraceLines(f, from, to)
		_ = f.Close()
		if err != nil {
			return err
		}
	}
	xs := exchanges(lines[0], lines[1])
	complete := 0
	for _, x := range xs {
		if x.complete() {
			complete++
		}
	}
	if complete == 0 {
		return fmt.Errorf("no exchange with every step in %s and %s (traced with virtqueue_pop, virtqueue_fill, colo_compare_tcp_info, colo_compare_main?)", primaryLog, secondaryLog)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d exchanges, %d with every step\n\n| step | p50 | p90 |\n| --- | ---: | ---: |\n", len(xs), complete)
	for _, span := range pingPongSpans {
		var ds []time.Duration
		for i, x := range xs {
			if !x.complete() {
				continue
			}
			var next exchange
			if i+1 < len(xs) {
				next = xs[i+1]
			}
			if d := span.of(x, next); d >= 0 {
				ds = append(ds, d)
			}
		}
		slices.SortFunc(ds, cmp.Compare)
		if len(ds) == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", span.name, ms(ds[len(ds)/2]), ms(ds[len(ds)*9/10]))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
