package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/lockstep-dev/lockstep/test/workloads"
)

func TestAcrossPutsEachRunsKeptSideBySide(t *testing.T) {
	second := report
	second.Date, second.Commit = "2026-11-28", "def5678"
	second.Rows = append(second.Rows[:0:0], report.Rows...)
	second.Rows[0].Protected = 180 // 0.90 kept: the goal met this time
	second.Rows = second.Rows[:2]  // its latency p50 not run
	var b bytes.Buffer
	if err := across(&b, []workloads.Report{report, second}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"| kept, 2026-11-27 (abc1234) | kept, 2026-11-28 (def5678) |",
		"| oltp | transactions | ≥ 0.80 | 0.60 (missed) | 0.90 |",
		"| oltp | latency p95 | ≥ 0.67 | 0.80 | 0.80 |",
		"| oltp | latency p50 |  | 0.80 | not run |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
}
