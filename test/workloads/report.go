package workloads

import (
	"encoding/json"
	"fmt"
	"os"
)

// Report is one run of the benchmark: every row, unprotected and protected on the same VM and
// machine, side by side. hack/benchreport turns it into docs/performance.md's table and chart.
type Report struct {
	Date    string `json:"date"`
	Commit  string `json:"commit"`
	Machine string `json:"machine"`
	// Guest is the VM every row ran in (vCPUs, memory, disks).
	Guest string `json:"guest"`
	// Span is how long each timed row ran, each way.
	Span string `json:"span"`
	// Pinned: the VM's QEMU (unprotected, then the primary) ran on one core and the secondary's on
	// another, as on two hosts of one core each; otherwise both shared all the host's cores.
	Pinned bool  `json:"pinned,omitempty"`
	Rows   []Row `json:"rows"`
}

// Cores says how the members' QEMUs shared the host's cores.
func (r Report) Cores() string {
	if r.Pinned {
		return "the VM's QEMU (unprotected, then the primary) pinned to one core and the secondary's to the other"
	}
	return "both QEMUs on all the host's cores"
}

// Row is one measure of one workload, both ways, with what protection did meanwhile.
type Row struct {
	Workload    string  `json:"workload"`
	Title       string  `json:"title"`
	Paper       string  `json:"paper"`
	Measure     Measure `json:"measure"`
	Unprotected float64 `json:"unprotected"`
	Protected   float64 `json:"protected"`
	Protection  Window  `json:"protection"`
	// CPU is what the workload's two runs cost the host's cores.
	CPU CPU `json:"cpu"`
}

// CPU is what a workload used of the host's cores while it ran, in cores (1: one core busy all
// along). Where both members share a host, a protected run that keeps every core busy is bound
// by the secondary's share of them, which members on hosts of their own do not pay.
type CPU struct {
	// Cores is how many the host has.
	Cores int `json:"cores"`
	// HostUnprotected and HostProtected are the whole host's busy cores in each run.
	HostUnprotected float64 `json:"hostUnprotected"`
	HostProtected   float64 `json:"hostProtected"`
	// PrimaryUnprotected and Primary are the VM's QEMU in each run; Secondary is its secondary's
	// QEMU. RelaysUnprotected and Relays are the benchmark's own process in each run, in which
	// both nodes' lockstepd run (and the benchmark's polls of them).
	PrimaryUnprotected float64 `json:"primaryUnprotected"`
	Primary            float64 `json:"primary"`
	Secondary          float64 `json:"secondary"`
	RelaysUnprotected  float64 `json:"relaysUnprotected"`
	Relays             float64 `json:"relays"`
}

// Window is what the protection did while the workload ran protected: its checkpoints and why
// they came, what it sent to the secondary, and how long the VM stood still for each.
type Window struct {
	Seconds              float64 `json:"seconds"`
	Checkpoints          int     `json:"checkpoints"`
	CheckpointsPerSecond float64 `json:"checkpointsPerSecond"`
	// OnMismatch, OnTimeout and OnCrossed (both sides' data waiting for each other) are the
	// checkpoints colo-compare forced; the rest came with the period (or dirty RAM ahead of it).
	OnMismatch uint64  `json:"onMismatch"`
	OnTimeout  uint64  `json:"onTimeout"`
	OnCrossed  uint64  `json:"onCrossed,omitempty"`
	LogMBps    float64 `json:"logMBps"`
	// StreamMBps is what each of COLO's streams carried over the logging link, both ways:
	// "migration" (the checkpoints: dirtied RAM and device state), "nbd" (the primary's disk
	// writes), "mirror" (the packets the VM receives, copied to the secondary) and "compare"
	// (the secondary's outgoing packets, back to the primary's colo-compare).
	StreamMBps map[string]float64 `json:"streamMBps,omitempty"`
	PauseP50Ms float64            `json:"pauseP50Ms"`
	PauseP90Ms float64            `json:"pauseP90Ms"`
}

// Ratio is protected/unprotected.
func (r Row) Ratio() float64 {
	if r.Unprotected == 0 {
		return 0
	}
	return r.Protected / r.Unprotected
}

// Kept is the share of the unprotected figure that protection keeps: the ratio where higher is
// better, its inverse where lower is (1: no cost).
func (r Row) Kept() float64 {
	if r.Measure.HigherIsBetter || r.Protected == 0 {
		return r.Ratio()
	}
	return r.Unprotected / r.Protected
}

// GoalMet says whether the row meets its goal (true where it has none).
func (r Row) GoalMet() bool {
	g := r.Measure
	ok := g.Goal == 0 || (g.HigherIsBetter && r.Ratio() >= g.Goal) || (!g.HigherIsBetter && r.Ratio() <= g.Goal)
	return ok && (g.Limit == 0 || r.Protected <= g.Limit)
}

// Write writes the report to file, as JSON.
func (r Report) Write(file string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(file, append(b, '\n'), 0o644)
}

// ReadReport reads a report Write wrote.
func ReadReport(file string) (Report, error) {
	var r Report
	b, err := os.ReadFile(file)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%s: %w", file, err)
	}
	return r, nil
}
