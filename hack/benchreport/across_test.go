package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/lockstep-dev/lockstep/test/workloads"
)

func TestAcrossPutsEachRunsKeptSideBySide(t *testing.T) {
	// Two runs of the same rows, each with its checkpoints, but for the second's latency p95.
	runs := make([]workloads.Report, 2)
	for i := range runs {
		runs[i] = report
		runs[i].Rows = append([]workloads.Row(nil), report.Rows...)
		for j := range runs[i].Rows {
			runs[i].Rows[j].Protection.Checkpoints = 40
		}
	}
	second := &runs[1]
	second.Date, second.Commit, second.Pinned = "2026-11-28", "def5678", true
	second.Rows[0].Protected = 180 // 0.90 kept: the goal met this time
	second.Rows[1].Protection.Checkpoints = 0
	second.Rows = second.Rows[:2] // its latency p50 not run
	added := second.Rows[0]       // a row the first run did not have
	added.Workload, added.Measure.Name = "net-transmit-stream", "throughput"
	second.Rows = append(second.Rows, added)
	var b bytes.Buffer
	if err := across(&b, runs); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"| kept, 2026-11-27 (abc1234) | kept, 2026-11-28 (def5678, pinned) |",
		"| oltp | transactions | ≥ 0.80 | 0.60 (missed) | 0.90 |",
		"| oltp | latency p95 | ≥ 0.67 | 0.80 | no checkpoint: not protected |",
		"| oltp | latency p50 |  | 0.80 | not run |",
		"| net-transmit-stream | throughput | ≥ 0.80 | not run | 0.90 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
}
