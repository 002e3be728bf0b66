//go:build linux && vmtier

package vmtier

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/testnet"
	"github.com/lockstep-dev/lockstep/test/counter"
)

// BenchmarkColoCost measures what COLO costs a VM, side by side in one run on the same guest and
// machine: the VM alone first, then the same VM protected, under three loads of the test guest
// (hack/guest):
//
//   - request/response: the counter, one request after the other, a connection each;
//   - mail-like: connections of ten messages each, every message written to the guest's disk and
//     flushed before the guest answers it (as a mail server commits a message before its 250);
//   - bulk: 1 MiB streams from the guest.
//
// It prints each figure unprotected and protected and their ratio, the checkpoints a second and
// the replication bandwidth under each load, and how colo-compare released the guest's data
// packets: on a match with the secondary's, or with a checkpoint (forced by a timeout or a
// mismatch, or the periodic one), from QEMU's trace events.
func BenchmarkColoCost(b *testing.B) {
	span := 10 * time.Second
	c := newCluster(b, 2)
	c.trace = append(c.trace, "colo_compare_tcp_info", "colo_old_packet_check_found")
	p := c.start(c.nodes[0], true, nil)
	c.attach(c.nodes[0])
	cl := &client{c: c}
	cl.next("the guest boots", 3*time.Minute)

	var alone, ft [3]load
	for i, run := range loads {
		alone[i] = run(c, span)
	}
	c.protect(p, c.nodes[1])
	var cps [3]window
	var released [3]releases
	var ram [3]checkpointRAM
	for i, run := range loads {
		before, ramBefore := countReleases(p), readCheckpointRAM(p)
		cps[i] = c.measure(p, span, func() { ft[i] = run(c, span) })
		released[i] = countReleases(p).minus(before)
		released[i].replies = ft[i].replies
		ram[i] = readCheckpointRAM(p).since(ramBefore)
	}
	for i := range loads {
		b.Logf("%s", alone[i].compare(ft[i]))
		b.Logf("  protected: %.2f checkpoints/s (%s), %.2f MB/s to the secondary, %s; %s; %s",
			cps[i].checkpointsPerSecond, cps[i].causes(), cps[i].bytesPerSec/1e6, cps[i].pauses(), ram[i], released[i])
	}
	rr, mail, bulk := 0, 1, 2
	b.ReportMetric(ratio(ft[rr].p(50), alone[rr].p(50)), "rr-p50-ratio")
	b.ReportMetric(ft[rr].perSecond/alone[rr].perSecond, "rr-rate-ratio")
	b.ReportMetric(ratio(ft[mail].p(95), alone[mail].p(95)), "mail-p95-ratio")
	b.ReportMetric(ms(ft[mail].p(95)), "mail-p95-ms")
	b.ReportMetric(ft[bulk].perSecond/alone[bulk].perSecond, "bulk-throughput-ratio")
	b.ReportMetric(released[rr].matchedShare(), "rr-matched-share")
	b.ReportMetric(cps[rr].pauseP90.Seconds()*1000, "rr-pause-p90-ms")
}

// load is what one load measured: the latency of each exchange and the rate (exchanges, or
// bytes for the bulk load, a second).
type load struct {
	name      string
	unit      string
	latencies []time.Duration
	perSecond float64
	// replies counts the guest's answers, each one data packet (0 for the bulk stream).
	replies int
}

func (l load) p(pc int) time.Duration { return pct(l.latencies, pc) }

func (l load) compare(ft load) string {
	return fmt.Sprintf("%s: latency p50 %s -> %s (x%.2f), p95 %s -> %s (x%.2f), p99 %s -> %s (x%.2f); %.1f -> %.1f %s (x%.2f)",
		l.name, l.p(50).Round(100*time.Microsecond), ft.p(50).Round(100*time.Microsecond), ratio(ft.p(50), l.p(50)),
		l.p(95).Round(100*time.Microsecond), ft.p(95).Round(100*time.Microsecond), ratio(ft.p(95), l.p(95)),
		l.p(99).Round(100*time.Microsecond), ft.p(99).Round(100*time.Microsecond), ratio(ft.p(99), l.p(99)),
		l.perSecond, ft.perSecond, l.unit, ft.perSecond/l.perSecond)
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

// loads are the benchmark's three loads, each run for a window.
var loads = []func(c *cluster, d time.Duration) load{requestResponse, mailLike, bulkStream}

func requestResponse(c *cluster, d time.Duration) load {
	l := load{name: "request/response (the counter)", unit: "requests/s"}
	start := time.Now()
	for time.Since(start) < d {
		t0 := time.Now()
		if _, err := counter.Ask(context.Background(), c.client, c.vmAddr+fmt.Sprintf(":%d", counter.Port)); err != nil {
			c.t.Fatalf("the counter: %v", err)
		}
		l.latencies = append(l.latencies, time.Since(t0))
	}
	l.perSecond = float64(len(l.latencies)) / time.Since(start).Seconds()
	l.replies = len(l.latencies)
	return l.sorted()
}

func mailLike(c *cluster, d time.Duration) load {
	l := load{name: "mail-like (10 committed messages a connection)", unit: "messages/s"}
	start := time.Now()
	for time.Since(start) < d {
		if err := mailSession(context.Background(), c, func(took time.Duration) { l.latencies = append(l.latencies, took) }); err != nil {
			c.t.Fatalf("the mail service: %v", err)
		}
		l.replies += 11 // ten 250s and the 221
	}
	l.perSecond = float64(len(l.latencies)) / time.Since(start).Seconds()
	return l.sorted()
}

// mailSession is one connection of the guest's mail-like service: ten messages, each answered
// with a 250 once the guest has written it to its disk and flushed it, then QUIT. answered sees
// each message's latency. Ending ctx closes the connection.
func mailSession(ctx context.Context, c *cluster, answered func(time.Duration)) error {
	conn, err := testnet.DialContext(ctx, c.client, "tcp", c.vmAddr+fmt.Sprintf(":%d", counter.Port+1))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	defer context.AfterFunc(ctx, func() { _ = conn.Close() })()
	_ = conn.SetDeadline(time.Now().Add(time.Minute))
	r := bufio.NewReader(conn)
	for i := range 10 {
		t0 := time.Now()
		if _, err := fmt.Fprintf(conn, "message %d from the benchmark's client, a line of some length\n", i); err != nil {
			return err
		}
		line, err := r.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "250 ") {
			return fmt.Errorf("answered %q: %v", line, err)
		}
		answered(time.Since(t0))
	}
	_, _ = fmt.Fprintf(conn, "QUIT\n")
	_, _ = r.ReadString('\n')
	return nil
}

// bulkPort is the guest's bulk service (hack/guest/bulk): "send N" is answered with N KiB of zeros.
const bulkPort = counter.Port + 2

func bulkStream(c *cluster, d time.Duration) load {
	const kib = 1024
	l := load{name: "bulk stream (1 MiB from the guest)", unit: "MB/s"}
	start := time.Now()
	var total int64
	for time.Since(start) < d {
		t0 := time.Now()
		conn, err := testnet.DialContext(context.Background(), c.client, "tcp", c.vmAddr+fmt.Sprintf(":%d", bulkPort))
		if err != nil {
			c.t.Fatalf("the bulk service: %v", err)
		}
		_ = conn.SetDeadline(time.Now().Add(time.Minute))
		if _, err := fmt.Fprintf(conn, "send %d\n", kib); err != nil {
			c.t.Fatalf("the bulk service: %v", err)
		}
		n, err := io.Copy(io.Discard, conn)
		_ = conn.Close()
		if err != nil || n != kib*1024 {
			c.t.Fatalf("the bulk service sent %d bytes, want %d: %v", n, kib*1024, err)
		}
		total += n
		l.latencies = append(l.latencies, time.Since(t0))
	}
	l.perSecond = float64(total) / 1e6 / time.Since(start).Seconds()
	return l.sorted()
}

func (l load) sorted() load {
	sort.Slice(l.latencies, func(i, j int) bool { return l.latencies[i] < l.latencies[j] })
	return l
}

// releases counts how colo-compare released the guest's TCP data packets, from the primary
// QEMU's trace events: a data packet of the primary's that matched the secondary's is traced
// (colo_compare_tcp_info "pri" with a payload); so is each scan that found a packet beyond the
// compare timeout (colo_old_packet_check_found), which forces a checkpoint. A reply that did not
// match left with a checkpoint: forced by a timeout or a mismatch, or the periodic one.
type releases struct {
	matched, timeouts int
	replies           int // the guest's answers in the window, each one data packet
}

func (r releases) minus(o releases) releases {
	return releases{matched: r.matched - o.matched, timeouts: r.timeouts - o.timeouts}
}

func (r releases) matchedShare() float64 {
	if r.replies == 0 {
		return 0
	}
	return float64(r.matched) / float64(r.replies)
}

func (r releases) String() string {
	if r.replies == 0 {
		return fmt.Sprintf("%d data packets released on a match; %d compare timeouts", r.matched, r.timeouts)
	}
	return fmt.Sprintf("%d of %d replies released on a match (%.0f%%), the rest with a checkpoint; %d compare timeouts",
		r.matched, r.replies, 100*r.matchedShare(), r.timeouts)
}

// checkpointRAM is the RAM the primary sent for each checkpoint, in bytes, from its QEMU's trace
// events: with its VM stopped (colo_checkpoint_ram), and before that while the VM ran
// (colo_send_ram_ahead, lockstepd's --colo-ram-ahead).
type checkpointRAM struct{ stopped, ahead []int }

func (r checkpointRAM) since(o checkpointRAM) checkpointRAM {
	return checkpointRAM{stopped: r.stopped[len(o.stopped):], ahead: r.ahead[len(o.ahead):]}
}

func (r checkpointRAM) String() string {
	p50 := func(v []int) float64 {
		if len(v) == 0 {
			return 0
		}
		v = slices.Clone(v)
		slices.Sort(v)
		return float64(v[len(v)/2]) / 1e3
	}
	return fmt.Sprintf("RAM a checkpoint p50 %.0f kB with the VM stopped, %.0f kB sent ahead", p50(r.stopped), p50(r.ahead))
}

// readCheckpointRAM reads the member's QEMU trace so far.
func readCheckpointRAM(m *member) checkpointRAM {
	data, _ := os.ReadFile(m.qemuLog)
	var r checkpointRAM
	events := map[string]*[]int{"colo_checkpoint_ram": &r.stopped, "colo_send_ram_ahead": &r.ahead}
	for _, line := range strings.Split(string(data), "\n") {
		for event, into := range events {
			if _, rest, ok := strings.Cut(line, event+" "); ok {
				if f := strings.Fields(rest); len(f) > 0 {
					if n, err := strconv.Atoi(f[0]); err == nil {
						*into = append(*into, n)
					}
				}
			}
		}
	}
	return r
}

// countReleases reads the member's QEMU trace so far.
func countReleases(m *member) releases {
	data, _ := os.ReadFile(m.qemuLog)
	var r releases
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.Contains(line, "colo_compare_tcp_info") && strings.Contains(line, "pri:") && !strings.Contains(line, "pdlen= 0 "):
			r.matched++
		case strings.Contains(line, "colo_old_packet_check_found"):
			r.timeouts++
		}
	}
	return r
}
