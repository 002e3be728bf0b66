// ratios reads `go test -bench` output (make bench) and prints the FT log's figures as ratios to
// the baselines measured beside them in the same run: throughput against raw TCP and raw TLS on
// the same path, gated-output latency against the path's round trip.

package main

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// line matches "BenchmarkX/path/kind-2   N   123 ns/op   4.5 unit ..." and captures the name;
// sub a benchmark with one level of sub-benchmarks ("BenchmarkCheckpointStream/direct-2  N  ...");
// single one without sub-benchmarks ("BenchmarkFailover-2  N  ...").
var (
	line   = regexp.MustCompile(`^Benchmark(\w+)/([\w-]+)/(\w+)(?:-\d+)?\s+\d+\s+(.*)$`)
	sub    = regexp.MustCompile(`^Benchmark(\w+)/([a-z]+)(?:-\d+)?\s+\d+\s+(.*)$`)
	single = regexp.MustCompile(`^Benchmark(\w+?)(?:-\d+)?\s+\d+\s+(.*)$`)
)

func parseMetrics(s string) map[string]float64 {
	fields := strings.Fields(s)
	m := map[string]float64{}
	for i := 0; i+1 < len(fields); i += 2 {
		if v, err := strconv.ParseFloat(fields[i], 64); err == nil {
			m[fields[i+1]] = v
		}
	}
	return m
}

func ratios() {
	metrics := map[string]map[string]float64{} // "bench/path/kind" -> unit -> value
	paths := map[string]bool{}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		fmt.Println(sc.Text()) // pass the raw output through
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			if m := sub.FindStringSubmatch(sc.Text()); m != nil {
				metrics[m[1]+"/"+m[2]] = parseMetrics(m[3])
			} else if m := single.FindStringSubmatch(sc.Text()); m != nil {
				metrics[m[1]] = parseMetrics(m[2])
			}
			continue
		}
		key := m[1] + "/" + m[2] + "/" + m[3]
		paths[m[2]] = true
		metrics[key] = parseMetrics(m[4])
	}
	names := make([]string, 0, len(paths))
	for p := range paths {
		names = append(names, p)
	}
	sort.Strings(names)
	get := func(bench, path, kind, unit string) float64 { return metrics[bench+"/"+path+"/"+kind][unit] }
	ratio := func(a, b float64) string {
		if b == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", a/b)
	}

	fmt.Println("\nFT log throughput (Mbit/s, 16 KiB entries; the paper's anchor: 950 Mbit/s of logging on a 1 Gbit link)")
	fmt.Printf("%-10s %10s %10s %10s %12s %12s\n", "path", "tcp", "tls", "ftlog", "ftlog/tcp", "ftlog/tls")
	for _, p := range names {
		tcp, tls, fl := get("LogThroughput", p, "tcp", "Mbit/s"), get("LogThroughput", p, "tls", "Mbit/s"), get("LogThroughput", p, "ftlog", "Mbit/s")
		if fl == 0 {
			continue
		}
		fmt.Printf("%-10s %10.0f %10.0f %10.0f %12s %12s\n", p, tcp, tls, fl, ratio(fl, tcp), ratio(fl, tls))
	}
	fmt.Println("\nGated output latency (µs): log an entry, hold an output behind it, release on its acknowledgement")
	fmt.Printf("%-10s %9s %9s %10s %10s %10s %10s\n", "path", "rtt p50", "rtt p99", "gated p50", "gated p99", "p50/rtt", "p99/rtt")
	for _, p := range names {
		r50, r99 := get("GatedOutputLatency", p, "rtt", "p50-µs"), get("GatedOutputLatency", p, "rtt", "p99-µs")
		g50, g99 := get("GatedOutputLatency", p, "gated", "p50-µs"), get("GatedOutputLatency", p, "gated", "p99-µs")
		if g50 == 0 {
			continue
		}
		fmt.Printf("%-10s %9.0f %9.0f %10.0f %10.0f %10s %10s\n", p, r50, r99, g50, g99, ratio(g50, r50), ratio(g99, r99))
	}
	if d, r := metrics["CheckpointStream/direct"], metrics["CheckpointStream/relayed"]; d != nil && r != nil {
		fmt.Println("\nA COLO checkpoint's stream (2.5 MB and its 4-byte answer): through both lockstepds' relays over TLS, against one Unix socket")
		fmt.Printf("direct %.2f ms (%.2f ms CPU)   relayed %.2f ms (%.2f ms CPU)   relayed/direct %s (CPU %s)\n",
			d["ns/op"]/1e6, d["cpu-ms/op"], r["ns/op"]/1e6, r["cpu-ms/op"], ratio(r["ns/op"], d["ns/op"]), ratio(r["cpu-ms/op"], d["cpu-ms/op"]))
	}
	if f := metrics["Failover"]; f != nil {
		fmt.Printf("\nFailure detection to go-live (kill -9 of the primary's lockstepd to the first output of the secondary gone live), %.0f kills, --detect %.0f ms\n", f["kills"], f["detect-ms"])
		fmt.Printf("p50 %.0f ms   p90 %.0f ms   p99 %.0f ms   max %.0f ms   p50/detect %s\n", f["p50-ms"], f["p90-ms"], f["p99-ms"], f["max-ms"], ratio(f["p50-ms"], f["detect-ms"]))
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
