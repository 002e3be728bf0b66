package main

import (
	"bytes"
	"image/png"
	"strings"
	"testing"

	"github.com/lockstep-dev/lockstep/test/workloads"
)

var report = workloads.Report{Date: "2026-11-27", Commit: "abc1234", Machine: "2 cores", Guest: "Debian 12", Span: "20s", Rows: []workloads.Row{
	{Workload: "oltp", Title: "OLTP", Paper: "negligible", Measure: workloads.Measure{Name: "transactions", Unit: "tx/s", HigherIsBetter: true, Goal: 0.8}, Unprotected: 200, Protected: 120,
		Protection: workloads.Window{CheckpointsPerSecond: 3.5, OnMismatch: 40, OnTimeout: 2, OnCrossed: 5, LogMBps: 12.5, PauseP50Ms: 30, PauseP90Ms: 80,
			StreamMBps: map[string]float64{"migration": 10, "nbd": 2, "mirror": 0.25, "compare": 0.5}},
		CPU: workloads.CPU{Cores: 2, HostUnprotected: 1.2, HostProtected: 1.95, PrimaryUnprotected: 1, Primary: 0.9, Secondary: 0.7, RelaysUnprotected: 0.05, Relays: 0.3}},
	{Workload: "oltp", Title: "OLTP", Paper: "negligible", Measure: workloads.Measure{Name: "latency p95", Unit: "ms", Goal: 1.5}, Unprotected: 40, Protected: 50},
	{Workload: "oltp", Title: "OLTP", Paper: "negligible", Measure: workloads.Measure{Name: "latency p50", Unit: "ms"}, Unprotected: 20, Protected: 25},
}}

func TestTableSaysEachRowAndItsGoal(t *testing.T) {
	var b bytes.Buffer
	if err := table(&b, report); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"commit abc1234", "| OLTP | transactions | 200 tx/s | 120 tx/s | 0.60 | ≥ 0.80: **missed** | 3.50 (40, 2, 5) | 12.5 MB/s | 30 / 80 ms | negligible |",
		"|  | latency p95 | 40.0 ms | 50.0 ms | 0.80 | ≥ 0.67: met |",
		"| oltp | 10.00 | 2.00 | 0.25 | 0.50 | 12.75 |",
		"busy cores of 2", "| oltp | 1.20 | 1.95 | 1.00 | 0.90 | 0.70 | 0.25 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
}

func TestTableLeavesOutTheCoresOfAReportWithoutThem(t *testing.T) {
	old := report
	old.Rows = append([]workloads.Row(nil), report.Rows...)
	old.Rows[0].CPU = workloads.CPU{} // a report from before the cores were measured
	var b bytes.Buffer
	if err := table(&b, old); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "busy cores") {
		t.Fatalf("the table has a cores table for a report without them:\n%s", b.String())
	}
}

func TestChartHasABarForEachRowWithAGoal(t *testing.T) {
	var b bytes.Buffer
	if err := chart(&b, report); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	if h := img.Bounds().Dy(); h != top+2*rowHeight+30 { // two rows have goals
		t.Fatalf("the chart is %d high, want two bars' worth", h)
	}
	// The first bar (0.60, missed) is red where it starts.
	if r, g, _, _ := img.At(labelWidth+5, top+rowHeight/2).RGBA(); r>>8 != 200 || g>>8 != 60 {
		t.Fatalf("the missed row's bar is %v, want red", img.At(labelWidth+5, top+rowHeight/2))
	}
}
