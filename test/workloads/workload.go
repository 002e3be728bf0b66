// Package workloads drives the programs users run in their VMs, from Debian's packages, with the
// load from outside the VM, as the rows of the vSphere FT white paper's table
// (docs/performance.md): a C build in the guest, network throughput both ways (iperf3), the
// latency-bound request/response case (sockperf), random disk I/O (fio), OLTP (pgbench against
// PostgreSQL) and mail submission under a steady load (smtp-source against Postfix). Each
// Workload runs once and returns what it measured; it asserts nothing about how fast.
//
// The benchmark (test/vmtier, make bench-workloads) runs every workload on one VM unprotected,
// then protected, and writes a Report, which hack/benchreport turns into the table and its chart;
// the libvirt tier runs each briefly on an unprotected VM, so that a broken driver fails CI.
package workloads

import (
	"context"
	"fmt"
	"math"
	"net"
	"os/exec"
	"strings"
	"time"
)

// Env is where a workload runs: the guest (lockstep's Debian test guest, hack/debian-guest.sh,
// with its data disk) and the client's side of the VM's network.
type Env struct {
	// Guest runs a shell command in the guest as a user that may sudo, and returns its output.
	Guest func(ctx context.Context, command string) (string, error)
	// Client makes a command that runs on the client's side (in its network namespace).
	Client func(ctx context.Context, name string, args ...string) *exec.Cmd
	// Dial opens a connection to the guest from the client's side.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Addr is the guest's address.
	Addr string
	// Span is how long a timed workload runs.
	Span time.Duration
	// Brief asks for the least that shows the driver works: a second or two, one file built.
	Brief bool
	// SMTPSource is Postfix's smtp-source, unpacked from Debian's package (hack/smtp-source.sh).
	SMTPSource string
}

// Measure is one figure a workload measured.
type Measure struct {
	Name  string  `json:"name"`
	Unit  string  `json:"unit"`
	Value float64 `json:"value,omitempty"`
	// HigherIsBetter: a throughput (a rate); otherwise a time (a latency, a build's length).
	HigherIsBetter bool `json:"higherIsBetter"`
	// Goal is the most protection may cost (issue 35), as protected/unprotected: at least Goal
	// where higher is better, at most Goal where lower is; 0 for none.
	Goal float64 `json:"goal,omitempty"`
	// Limit is an absolute bound on the protected figure, in Unit (0 for none): Send Mail's p95
	// under 500 ms.
	Limit float64 `json:"limit,omitempty"`
}

// Workload is one row of the table.
type Workload struct {
	Name  string
	Title string
	// Paper is the white paper's row this one stands beside, and what it found.
	Paper string
	// Setup prepares the guest before a side's first run (unprotected, then protected): tables
	// made anew, files laid out once. Nil for none.
	Setup func(ctx context.Context, env Env) error
	Run   func(ctx context.Context, env Env) ([]Measure, error)
}

// All is every workload, in the table's order.
func All() []Workload {
	return []Workload{
		build,
		iperfReceive, iperfTransmit, streamTransmit,
		sockperfPingPong,
		fioRow("randread", 2), fioRow("randwrite", 2), fioRow("randread", 64), fioRow("randwrite", 64),
		pgbench, pgbenchSimpleUpdate,
		sendMail,
	}
}

// Check says what is wrong with measures a run returned: none, or one that is not a positive
// finite number.
func Check(w Workload, ms []Measure) error {
	if len(ms) == 0 {
		return fmt.Errorf("%s measured nothing", w.Name)
	}
	for _, m := range ms {
		if m.Value <= 0 || math.IsNaN(m.Value) || math.IsInf(m.Value, 0) {
			return fmt.Errorf("%s: %s is %v %s", w.Name, m.Name, m.Value, m.Unit)
		}
	}
	return nil
}

// seconds is a timed run's length in whole seconds, at least one (two for a brief run).
func (e Env) seconds() int {
	if e.Brief {
		return 2
	}
	return max(1, int(e.Span.Round(time.Second)/time.Second))
}

// output runs a client command and returns what it printed, both streams.
func output(cmd *exec.Cmd) (string, error) {
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", cmd.Args, err, lastLine(string(out)))
	}
	return string(out), nil
}

// lastLine is the last line of a program's output, for an error message.
func lastLine(s string) string {
	s = strings.TrimRight(s, "\r\n")
	return s[strings.LastIndexByte(s, '\n')+1:]
}
