//go:build linux

package dataplane

import (
	"fmt"
	"sort"
	"testing"
	"time"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/test/vmdouble"
)

// BenchmarkFailover kills the primary's lockstepd (kill -9, its VM with it) b.N times and
// measures, for each kill, the time until a client sees the first output of the secondary gone
// live: failure detection (the --detect silence), the Lease claim, and the VM's start. After
// each kill the killed node gets a new secondary, and the next kill hits the new primary.
// make bench runs it with -benchtime 50x.
func BenchmarkFailover(b *testing.B) {
	c := newCluster(b, 2)
	c.protect()
	prim, sec := 0, 1
	primary, secondary := "a", "b"
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		killed := vmdouble.Monotonic()
		c.kill(c.nodes[prim])
		eventually(b, secondary+" goes live", 10*time.Second, func() bool { return c.obs.first(secondary) != 0 })
		samples = append(samples, time.Duration(c.obs.first(secondary)-killed))

		// Re-protect, as the operator would: promote the live member, replace the lost one.
		b.StopTimer()
		c.promote(secondary)
		c.deleteMember(primary)
		next := fmt.Sprintf("m%d", i)
		c.member(next, ftv1.RoleSecondary, c.nodes[prim])
		c.start(c.nodes[prim])
		live := secondary
		eventually(b, "protected again", 20*time.Second, func() bool {
			p, s := c.primaryReport(), c.secondaryReport()
			return p != nil && p.VMI == live && p.State == "Protected" && s != nil && s.VMI == next && s.Synchronized
		})
		prim, sec = sec, prim
		primary, secondary = live, next
		b.StartTimer()
	}
	b.StopTimer()
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	at := func(q float64) float64 {
		return float64(samples[int(q*float64(len(samples)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(at(0.5), "p50-ms")
	b.ReportMetric(at(0.9), "p90-ms")
	b.ReportMetric(at(0.99), "p99-ms")
	b.ReportMetric(at(1), "max-ms")
	b.ReportMetric(float64(detect.Milliseconds()), "detect-ms")
	b.ReportMetric(float64(len(samples)), "kills")
}
