package workloads

import (
	"math"
	"os"
	"path/filepath"
	"testing"
)

// The reports below are the programs' own (Debian 12's iperf3 3.12, sockperf 3.7, fio 3.33,
// pgbench 15), cut to what the parsers read and what could mislead them.

func TestParseIperfReadsTheReceiversThroughput(t *testing.T) {
	bps, err := parseIperf([]byte(`{"start": {}, "intervals": [], "end": {
		"sum_sent": {"bytes": 1250000000, "bits_per_second": 1000000000.5},
		"sum_received": {"bytes": 1200000000, "bits_per_second": 960000000.25}}}`))
	if err != nil || bps != 960000000.25 {
		t.Fatalf("got %v, %v; want the receiver's 960000000.25", bps, err)
	}
	if _, err := parseIperf([]byte(`{"start": {}, "intervals": [], "end": {}, "error": "unable to connect to server: Connection refused"}`)); err == nil {
		t.Fatal("an iperf3 report with an error parsed")
	}
}

func TestParseSockperfReadsPercentilesAndTheValidDurationsRate(t *testing.T) {
	out := "sockperf: [Total Run] RunTime=1.000 sec; Warm up time=400 msec; SentMessages=52758; ReceivedMessages=52757\n" +
		"sockperf: ========= Printing statistics for Server No: 0\n" +
		"sockperf: [Valid Duration] RunTime=0.550 sec; SentMessages=27579; ReceivedMessages=27500\n" +
		"sockperf: \x1b[2;35m====> avg-rtt=19.928 (std-dev=127.877)\x1b[0m\n" +
		"sockperf: ---> <MAX> observation = 6244.167\n" +
		"sockperf: ---> percentile 99.999 = 6244.167\n" +
		"sockperf: ---> percentile 99.000 =   41.151\n" +
		"sockperf: ---> percentile 90.000 =   16.875\n" +
		"sockperf: ---> percentile 50.000 =   14.321\n" +
		"sockperf: ---> <MIN> observation =   13.389\n"
	r, err := parseSockperf(out)
	if err != nil {
		t.Fatal(err)
	}
	if r.p50 != 14.321 || r.p99 != 41.151 || math.Abs(r.perSecond-50000) > 1e-6 {
		t.Fatalf("got %+v, want p50 14.321, p99 41.151, 50000 a second", r)
	}
	if _, err := parseSockperf("sockperf: ERROR: Failed to connect\n"); err == nil {
		t.Fatal("a sockperf run without statistics parsed")
	}
}

func TestParseFioReadsTheSideItWasAskedFor(t *testing.T) {
	out := []byte(`{"fio version": "fio-3.33", "jobs": [{"jobname": "randwrite", "error": 0,
		"read": {"bw_bytes": 0, "clat_ns": {"percentile": {"50.000000": 0}}},
		"write": {"bw_bytes": 91531892, "clat_ns": {"percentile": {"50.000000": 228352}}}}]}`)
	w, err := parseFio(out, "randwrite")
	if err != nil || w.bytesPerSecond != 91531892 || w.p50 != 228352 {
		t.Fatalf("got %+v, %v", w, err)
	}
	if r, err := parseFio(out, "randread"); err != nil || r.bytesPerSecond != 0 {
		t.Fatalf("the reads of a write job: %+v, %v", r, err)
	}
	if _, err := parseFio([]byte(`{"jobs": [{"error": 5}]}`), "randread"); err == nil {
		t.Fatal("a job with an error parsed")
	}
}

func TestPgbenchTPSAndLatenciesFromItsSummaryAndLogs(t *testing.T) {
	tps, err := parsePgbenchTPS("latency average = 19.851 ms\ninitial connection time = 31.120 ms\ntps = 201.503390 (without initial connection time)\n")
	if err != nil || tps != 201.50339 {
		t.Fatalf("tps %v, %v", tps, err)
	}
	if _, err := parsePgbenchTPS("pgbench: error: connection to server failed\n"); err == nil {
		t.Fatal("a failed run gave a tps")
	}
	dir := t.TempDir()
	// client transaction latency_us script epoch us; two clients' threads, two files.
	logs := map[string]string{"tx.1001": "0 0 12000 0 1764230000 100\n0 1 30000 0 1764230000 200\n", "tx.1001.1": "1 0 9000 0 1764230000 300\n1 1 21000 0 1764230000 400\n1 2 failed 0 1764230000 500\n"}
	for f, s := range logs {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	lat, err := pgbenchLatencies(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(lat) != 4 || lat[0] != 9 || lat[3] != 30 || percentile(lat, 50) != 12 || percentile(lat, 95) != 30 || percentile(lat, 0) != 9 {
		t.Fatalf("latencies %v (p0 %v, p50 %v, p95 %v), want [9 12 21 30] in ms, p0 9, p50 12, p95 30", lat, percentile(lat, 0), percentile(lat, 50), percentile(lat, 95))
	}
	if _, err := pgbenchLatencies(t.TempDir()); err == nil {
		t.Fatal("no logs gave latencies")
	}
}

func TestRowsKeepTheirGoals(t *testing.T) {
	for _, c := range []struct {
		row  Row
		kept float64
		met  bool
	}{
		{Row{Measure: Measure{HigherIsBetter: true, Goal: 0.8}, Unprotected: 100, Protected: 85}, 0.85, true},
		{Row{Measure: Measure{HigherIsBetter: true, Goal: 0.8}, Unprotected: 100, Protected: 40}, 0.4, false},
		{Row{Measure: Measure{Goal: 2}, Unprotected: 1, Protected: 1.5}, 1 / 1.5, true},
		{Row{Measure: Measure{Goal: 1.2, Limit: 500}, Unprotected: 450, Protected: 520}, 450.0 / 520, false}, // within the ratio, over the limit
		{Row{Measure: Measure{Goal: 1.2, Limit: 500}, Unprotected: 100, Protected: 130}, 100.0 / 130, false},
		{Row{Measure: Measure{}, Unprotected: 1, Protected: 9}, 1.0 / 9, true}, // no goal
	} {
		if k := c.row.Kept(); math.Abs(k-c.kept) > 1e-9 || c.row.GoalMet() != c.met {
			t.Errorf("%+v: kept %v met %v, want %v %v", c.row, k, c.row.GoalMet(), c.kept, c.met)
		}
	}
}

func TestEveryWorkloadIsNamedOnceAndHasAGoal(t *testing.T) {
	seen := map[string]bool{}
	for _, w := range All() {
		if seen[w.Name] || w.Title == "" || w.Paper == "" || w.Run == nil {
			t.Errorf("%q: a second of that name, or no title, paper row or driver", w.Name)
		}
		seen[w.Name] = true
	}
}

func TestLastLineIsTheLastLineWithText(t *testing.T) {
	for in, want := range map[string]string{"": "", "one": "one", "a\nb\n": "b", "a\r\nb\r\n\r\n": "b", "\n": ""} {
		if got := lastLine(in); got != want {
			t.Errorf("lastLine(%q) = %q, want %q", in, got, want)
		}
	}
}
