//go:build linux && vmtier

package vmtier

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/colo"
	"github.com/lockstep-dev/lockstep/internal/failover"
)

// BenchmarkColoFailover measures a COLO pair on real QEMU (TCG): the checkpoint pause and
// interval and the replication bandwidth of an idle and a busy guest, then FAILOVERS (default 10)
// failovers in a row, each a kill -9 of the primary's QEMU followed by the re-protection of the
// live VM with a new secondary on the node that lost its QEMU. Every reply is checked as in the
// tests. It reports medians and spreads as metrics; the figures go into the note. It
// runs on both stacks, one after the other: members launched directly, and launched as
// KubeVirt's virt-launcher would, through the hook and libvirt.
func BenchmarkColoFailover(b *testing.B) {
	b.Run("direct", func(b *testing.B) { coloFailover(b, direct) })
	b.Run("libvirt", func(b *testing.B) { coloFailover(b, viaLibvirt) })
}

func coloFailover(b *testing.B, on stack) {
	runs := 50
	if v, err := strconv.Atoi(os.Getenv("FAILOVERS")); err == nil && v > 0 {
		runs = v
	}
	c := newCluster(b, 3)
	c.viaLibvirt = bool(on)
	p := c.start(c.nodes[0], true, nil)
	c.attach(c.nodes[0])
	cl := &client{c: c}
	cl.next("the guest boots", 3*time.Minute)
	s := c.protect(p, c.nodes[1])
	cl.next("protected", time.Minute)

	window := 10 * time.Second
	idle := c.measure(p, window, nil)
	busy := c.measure(p, window, func() { cl.next("busy", 10*time.Second) })
	b.Logf("idle guest: %s", idle)
	b.Logf("busy guest (a request after the other): %s", busy)
	b.Logf("the primary's streams (sent, received): %v; the secondary's: %v", p.engine.StreamBytes(), s.engine.StreamBytes())

	// The failovers are measured with a client that expects them: it gives a connection attempt
	// 100 ms before it tries again, rather than waiting a second for the kernel's first SYN
	// retransmission.
	cl.dialTimeout = 100 * time.Millisecond
	var failovers []time.Duration
	var parts [4][]time.Duration // detection, claim, go-live and network, first reply
	for i := range runs {
		seen := watchStates(s)
		// The client asks from the moment of the kill (a QEMU under libvirt is gone from the
		// network at once, but libvirtd reaps it only once it has torn its domain down).
		killed := time.Now()
		p.kill9()
		at := cl.next(fmt.Sprintf("failover %d", i+1), time.Minute)
		<-p.exited
		failovers = append(failovers, at.Sub(killed))
		c.waitState(s, failover.Alone, 10*time.Second)
		states := seen()
		c.mu.Lock()
		attached := c.attachedAt
		c.mu.Unlock()
		claimed := states[failover.Claiming]
		if claimed.IsZero() { // a claim shorter than the watch's millisecond
			claimed = states[failover.Alone]
		}
		parts[0] = append(parts[0], claimed.Sub(killed))
		parts[1] = append(parts[1], states[failover.Alone].Sub(claimed))
		parts[2] = append(parts[2], attached.Sub(states[failover.Alone]))
		parts[3] = append(parts[3], at.Sub(attached))
		cl.serveFor("after failover", 2*time.Second)
		// The live VM is protected again, on the node whose QEMU died.
		dead := p.node
		p = s
		s = c.protect(p, dead)
		cl.next("protected again", time.Minute)
	}
	sort.Slice(failovers, func(i, j int) bool { return failovers[i] < failovers[j] })
	b.Logf("kill -9 of the primary QEMU to the first reply of the live secondary, %d runs: %v", runs, failovers)
	for i, name := range []string{"kill to the secondary's claim (detection)", "the claim (the record)", "go-live and the network moved", "to the client's first reply"} {
		sort.Slice(parts[i], func(a, b int) bool { return parts[i][a] < parts[i][b] })
		b.Logf("  %s: p50 %s, p99 %s", name, pct(parts[i], 50).Round(100*time.Microsecond), pct(parts[i], 99).Round(100*time.Microsecond))
	}
	b.ReportMetric(ms(pct(failovers, 50)), "failover-p50-ms")
	b.ReportMetric(ms(pct(failovers, 90)), "failover-p90-ms")
	b.ReportMetric(ms(pct(failovers, 99)), "failover-p99-ms")
	b.ReportMetric(ms(failovers[len(failovers)-1]), "failover-max-ms")
	b.ReportMetric(ms(idle.pauseP50), "pause-idle-p50-ms")
	b.ReportMetric(ms(busy.pauseP50), "pause-busy-p50-ms")
	b.ReportMetric(ms(idle.interval), "interval-idle-ms")
	b.ReportMetric(ms(busy.interval), "interval-busy-ms")
	b.ReportMetric(idle.bytesPerSec/1e6, "idle-MB/s")
	b.ReportMetric(busy.bytesPerSec/1e6, "busy-MB/s")
}

// window is what one measurement window saw.
type window struct {
	checkpoints                      int
	pauseP50, pauseP90               time.Duration
	loadP50, loadP90                 time.Duration // the secondary's part of the pause
	onMismatch, onTimeout, onCrossed uint64        // checkpoints colo-compare forced, by cause
	interval                         time.Duration // mean time between checkpoints
	bytesPerSec                      float64
	requests                         int
	checkpointsPerSecond             float64
	start                            time.Time // when the window began; it lasted elapsed
	elapsed                          time.Duration
	// longestGap is the longest time in the window without a checkpoint (from its start to the
	// first, between two, from the last to its end).
	longestGap time.Duration
	// streamMBps is what each COLO stream carried over the logging link, both ways, in MB/s
	// (colo.StreamMigration, StreamNBD, StreamMirror, StreamCompare).
	streamMBps map[string]float64
}

func (w window) String() string {
	return fmt.Sprintf("%d checkpoints (%.2f/s; %s), %s, mean interval %s, %.2f MB/s to the secondary, %d requests",
		w.checkpoints, w.checkpointsPerSecond, w.causes(), w.pauses(),
		w.interval.Round(time.Millisecond), w.bytesPerSec/1e6, w.requests)
}

// causes says why colo-compare forced checkpoints, as the engine reports it.
func (w window) causes() string {
	return fmt.Sprintf("%d forced on a mismatch, %d on a timeout, %d crossed", w.onMismatch, w.onTimeout, w.onCrossed)
}

// pauses says how long the primary's VM stood still, and how long the secondary then took to load
// the checkpoint while the primary ran.
func (w window) pauses() string {
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	return fmt.Sprintf("pause p50 %s p90 %s (then the secondary's load, the primary running: p50 %s p90 %s)", r(w.pauseP50), r(w.pauseP90), r(w.loadP50), r(w.loadP90))
}

// measure runs work (if any) over and over for d (work at least once) and reads the primary's
// checkpoints and stream bytes in that time.
func (c *cluster) measure(p *member, d time.Duration, work func()) window {
	c.mu.Lock()
	from := len(c.checkpoints)
	c.mu.Unlock()
	before, streamsBefore := p.engine.Streams(), p.engine.StreamBytes()
	start := time.Now()
	var w window
	for first := true; first || time.Since(start) < d; first = false {
		if work != nil {
			work()
			w.requests++
		} else {
			time.Sleep(100 * time.Millisecond)
		}
	}
	elapsed := time.Since(start)
	w.start, w.elapsed = start, elapsed
	after := p.engine.Streams()
	w.streamMBps = map[string]float64{}
	for s, b := range p.engine.StreamBytes() {
		was := streamsBefore[s] // zero where the stream began within the window
		w.streamMBps[s] = float64(b[0]+b[1]-was[0]-was[1]) / 1e6 / elapsed.Seconds()
	}
	w.bytesPerSec = float64(after.Bytes-before.Bytes) / elapsed.Seconds()
	if !after.CausesKnown {
		c.t.Fatalf("the engine does not tell the checkpoints' causes apart: is the QEMU lockstep's?")
	}
	w.onMismatch, w.onTimeout, w.onCrossed = after.OnMismatch-before.OnMismatch, after.OnTimeout-before.OnTimeout, after.OnCrossed-before.OnCrossed
	c.mu.Lock()
	cps := append([]colo.Checkpoint(nil), c.checkpoints[from:]...)
	c.mu.Unlock()
	w.checkpoints = len(cps)
	w.checkpointsPerSecond = float64(len(cps)) / elapsed.Seconds()
	last := start
	for _, cp := range cps {
		w.longestGap = max(w.longestGap, cp.At.Sub(last))
		last = cp.At
	}
	w.longestGap = max(w.longestGap, start.Add(elapsed).Sub(last))
	var pauses, loads []time.Duration
	var sum time.Duration
	n := 0
	for _, cp := range cps {
		pauses, loads = append(pauses, cp.Pause), append(loads, cp.Load)
		if cp.Interval > 0 {
			sum += cp.Interval
			n++
		}
	}
	sort.Slice(pauses, func(i, j int) bool { return pauses[i] < pauses[j] })
	sort.Slice(loads, func(i, j int) bool { return loads[i] < loads[j] })
	w.pauseP50, w.pauseP90 = pct(pauses, 50), pct(pauses, 90)
	w.loadP50, w.loadP90 = pct(loads, 50), pct(loads, 90)
	if n > 0 {
		w.interval = sum / time.Duration(n)
	}
	return w
}

func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, len(sorted)*p/100)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// watchStates records when the member's agent first enters each state from now on, polling every
// millisecond, until the returned function is called; that returns what it saw.
func watchStates(m *member) func() map[failover.State]time.Time {
	seen := map[failover.State]time.Time{}
	var mu sync.Mutex
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			st := m.agent.State()
			mu.Lock()
			if _, ok := seen[st]; !ok {
				seen[st] = time.Now()
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return func() map[failover.State]time.Time {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

// BenchmarkColoResync measures, side by side on one pair, a whole resync and an incremental one
// after the same writes: the primary's data disk holds 48 MiB of data; its secondary's QEMU dies,
// the primary runs alone and writes 1 MiB; a new secondary on the dead one's copies catches up;
// it dies too, the primary writes the same 1 MiB again, and a secondary on blank copies is
// resynced whole. It reports the bytes of each and the ratio of their times.
func BenchmarkColoResync(b *testing.B) {
	c := newCluster(b, 4)
	c.dataDisk = true
	p := c.start(c.nodes[0], true, nil)
	c.attach(c.nodes[0])
	cl := &client{c: c}
	cl.next("the guest boots", 3*time.Minute)
	ioOn(b, p, "write -P 0x5a 1M 48M") // the guest writes its counter to the disk's first sector only
	s := c.protect(p, c.nodes[1])
	cl.next("protected", time.Minute)
	aloneWrite := func(dead *member, pattern int) {
		dead.killQEMU()
		c.waitState(p, failover.Alone, time.Minute)
		ioOn(b, p, fmt.Sprintf("write -P %#x 2M 1M", pattern))
		cl.next("alone", time.Minute)
	}
	aloneWrite(s, 0xa5)
	caughtUp := c.protectOn(p, c.nodes[2], s)
	inc := p.engine.Streams().LastResync
	aloneWrite(caughtUp, 0x5a)
	c.protect(p, c.nodes[3])
	whole := p.engine.Streams().LastResync
	if !inc.Incremental || whole.Incremental {
		b.Fatalf("the resyncs: %+v and %+v; want an incremental one, then a whole one", inc, whole)
	}
	b.Logf("whole resync: %d bytes in %s; incremental: %d bytes in %s", whole.Bytes, whole.Took.Round(time.Millisecond), inc.Bytes, inc.Took.Round(time.Millisecond))
	b.ReportMetric(float64(whole.Bytes), "whole-bytes")
	b.ReportMetric(float64(inc.Bytes), "incremental-bytes")
	b.ReportMetric(float64(whole.Took)/float64(inc.Took), "whole/incremental-time")
}
