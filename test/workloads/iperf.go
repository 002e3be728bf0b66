package workloads

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
)

// iperfPort is iperf3's own.
const iperfPort = 5201

// iperfReceive and iperfTransmit are the network throughput rows, as the white paper's netperf
// rows: one TCP stream for the run's span, the client sending into the VM (receive) or the VM
// sending to the client (transmit: iperf3 -R), from the VM's side.
var (
	iperfReceive = Workload{
		Name: "net-receive", Title: "Network receive (iperf3, one TCP stream into the VM)",
		Paper: "netperf Rx: 890 Mbit/s received with FT, 950 Mbit/s on the FT logging link (all received traffic is logged)",
		Run:   func(ctx context.Context, env Env) ([]Measure, error) { return iperf(ctx, env, false) },
	}
	iperfTransmit = Workload{
		Name: "net-transmit", Title: "Network transmit (iperf3 -R, one TCP stream from the VM)",
		Paper: "netperf Tx: little FT logging traffic (acknowledgements, transmit completions)",
		Run:   func(ctx context.Context, env Env) ([]Measure, error) { return iperf(ctx, env, true) },
	}
)

func iperf(ctx context.Context, env Env, reverse bool) ([]Measure, error) {
	stop, err := startServer(ctx, env, "iperf3", iperfPort, fmt.Sprintf("iperf3 --server --one-off --port %d", iperfPort))
	if err != nil {
		return nil, err
	}
	defer stop()
	args := []string{"--client", env.Addr, "--port", strconv.Itoa(iperfPort), "--time", strconv.Itoa(env.seconds()), "--json"}
	if reverse {
		args = append(args, "--reverse")
	}
	out, err := output(env.Client(ctx, "iperf3", args...))
	if err != nil {
		return nil, err
	}
	bps, err := parseIperf([]byte(out))
	if err != nil {
		return nil, err
	}
	return []Measure{{Name: "throughput", Unit: "Mbit/s", Value: bps / 1e6, HigherIsBetter: true, Goal: 0.8}}, nil
}

// parseIperf reads the receiver's throughput, bits a second, from iperf3's JSON report.
func parseIperf(out []byte) (float64, error) {
	var r struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return 0, fmt.Errorf("iperf3's report: %w", err)
	}
	if r.Error != "" {
		return 0, fmt.Errorf("iperf3: %s", r.Error)
	}
	return r.End.SumReceived.BitsPerSecond, nil
}
