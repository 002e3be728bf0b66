package workloads

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
)

// sockperfPort is the port of sockperf's server in the guest.
const sockperfPort = 11111

// sockperfPingPong is the latency-bound row: one 8 KiB message at a time over TCP, each answered
// before the next goes (sockperf ping-pong, the white paper's netperf request/response case with
// 8K messages), its round trips and how many a second.
var sockperfPingPong = Workload{
	Name: "net-latency", Title: "Latency-bound request/response (sockperf ping-pong, 8 KiB over TCP)",
	Paper: "netperf latency-bound case (8K messages, one outstanding): higher latency with FT, throughput down accordingly (no known real application behaves so)",
	Run: func(ctx context.Context, env Env) ([]Measure, error) {
		stop, err := startServer(ctx, env, "sockperf", sockperfPort, fmt.Sprintf("sockperf server --tcp -i 0.0.0.0 -p %d", sockperfPort))
		if err != nil {
			return nil, err
		}
		defer stop()
		out, err := output(env.Client(ctx, "sockperf", "ping-pong", "--tcp", "-i", env.Addr, "-p", strconv.Itoa(sockperfPort),
			"-m", "8192", "-t", strconv.Itoa(env.seconds()), "--full-rtt"))
		if err != nil {
			return nil, err
		}
		r, err := parseSockperf(out)
		if err != nil {
			return nil, err
		}
		return []Measure{
			{Name: "round trip p50", Unit: "ms", Value: r.p50 / 1000, Goal: 2},
			{Name: "round trip p99", Unit: "ms", Value: r.p99 / 1000},
			{Name: "exchanges", Unit: "/s", Value: r.perSecond, HigherIsBetter: true},
		}, nil
	},
}

type sockperfResult struct {
	p50, p99  float64 // microseconds
	perSecond float64
}

var (
	sockperfPercentile = regexp.MustCompile(`percentile (\d+\.\d+) =\s+([0-9.]+)`)
	sockperfValid      = regexp.MustCompile(`\[Valid Duration\] RunTime=([0-9.]+) sec; SentMessages=\d+; ReceivedMessages=(\d+)`)
)

// parseSockperf reads the round trips' percentiles (with --full-rtt) and the exchanges a second
// of the run's valid duration (after its warm-up) from sockperf's report.
func parseSockperf(out string) (sockperfResult, error) {
	var r sockperfResult
	for _, m := range sockperfPercentile.FindAllStringSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		switch m[1] {
		case "50.000":
			r.p50 = v
		case "99.000":
			r.p99 = v
		}
	}
	m := sockperfValid.FindStringSubmatch(out)
	if m == nil || r.p50 == 0 {
		return r, fmt.Errorf("sockperf's report has no percentiles or valid duration: %s", lastLine(out))
	}
	secs, _ := strconv.ParseFloat(m[1], 64)
	n, _ := strconv.ParseFloat(m[2], 64)
	if secs > 0 {
		r.perSecond = n / secs
	}
	return r, nil
}
