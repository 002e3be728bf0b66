// The table of make bench-workloads (test/workloads' Report): every row unprotected and
// protected, the share of the unprotected figure protection keeps against the row's goal, what
// the protection did meanwhile, and the white paper's finding beside it.

package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/lockstep-dev/lockstep/test/workloads"
)

// workloadsReport writes the report's table to stdout, and its chart to png if it is set.
func workloadsReport(file, png string) error {
	r, err := workloads.ReadReport(file)
	if err != nil {
		return err
	}
	if err := table(os.Stdout, r); err != nil {
		return err
	}
	if png == "" {
		return nil
	}
	f, err := os.Create(png)
	if err != nil {
		return err
	}
	err = chart(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// table writes the report as Markdown: the run, then one line per row.
func table(w io.Writer, r workloads.Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Run of %s, commit %s, on %s, %s; the guest: %s; each timed row %s each way. "+
		"Kept is the share of the unprotected figure that protection keeps: protected/unprotected for a rate, unprotected/protected for a time (1: no cost).\n\n",
		r.Date, r.Commit, r.Machine, r.Cores(), r.Guest, r.Span)
	b.WriteString("| workload | measure | unprotected | protected | kept | goal | checkpoints/s (forced: mismatch, timeout, crossed) | to the secondary | pause p50 / p90 | the white paper |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | --- | --- | ---: | --- | --- |\n")
	last := ""
	for _, row := range r.Rows {
		title, paper := row.Title, row.Paper
		if row.Workload == last { // the same workload's further measures
			title, paper = "", ""
		}
		last = row.Workload
		p := row.Protection
		fmt.Fprintf(&b, "| %s | %s | %s %s | %s %s | %.2f | %s | %.2f (%d, %d, %d) | %.1f MB/s | %.0f / %.0f ms | %s |\n",
			title, row.Measure.Name, num(row.Unprotected), row.Measure.Unit, num(row.Protected), row.Measure.Unit,
			row.Kept(), goal(row), p.CheckpointsPerSecond, p.OnMismatch, p.OnTimeout, p.OnCrossed, p.LogMBps, p.PauseP50Ms, p.PauseP90Ms, paper)
	}
	streams(&b, r)
	cpu(&b, r)
	_, err := io.WriteString(w, b.String())
	return err
}

// streams writes, for each workload, what each of COLO's streams carried over the logging link
// while it ran protected (the log bandwidth, by what it is made of).
func streams(b *strings.Builder, r workloads.Report) {
	names := []string{"migration", "nbd", "mirror", "compare"}
	b.WriteString("\nThe logging link during each protected run, by stream, both ways (MB/s): migration carries the checkpoints " +
		"(the RAM the guest dirtied, device state), nbd the disk writes, mirror the packets the VM receives, compare the secondary's " +
		"outgoing packets.\n\n| workload | migration | nbd | mirror | compare | all |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
	seen := map[string]bool{}
	for _, row := range r.Rows {
		if seen[row.Workload] || row.Protection.StreamMBps == nil {
			continue
		}
		seen[row.Workload] = true
		fmt.Fprintf(b, "| %s |", row.Workload)
		all := 0.0
		for _, n := range names {
			v := row.Protection.StreamMBps[n]
			all += v
			fmt.Fprintf(b, " %.2f |", v)
		}
		fmt.Fprintf(b, " %.2f |\n", all)
	}
}

// cpu writes, for each workload, what it used of the host's cores in each run: the whole host,
// the VM's QEMU, its secondary's, and what the relays added (reports before they were measured
// have none, and get no table).
func cpu(b *strings.Builder, r workloads.Report) {
	seen, header := map[string]bool{}, false
	for _, row := range r.Rows {
		c := row.CPU
		if seen[row.Workload] || c.Cores == 0 {
			continue
		}
		seen[row.Workload] = true
		if !header {
			fmt.Fprintf(b, "\nThe host's cores during each run (busy cores of %d: 1 is one core busy all along): the whole host, the VM's QEMU, "+
				"the secondary's QEMU, and what the relays (both nodes' lockstepd, in the benchmark's process) used beyond the unprotected run.\n\n"+
				"| workload | the host, unprotected | the host, protected | the VM's QEMU, unprotected | the primary's QEMU | the secondary's QEMU | the relays |\n"+
				"| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n", c.Cores)
			header = true
		}
		fmt.Fprintf(b, "| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
			row.Workload, c.HostUnprotected, c.HostProtected, c.PrimaryUnprotected, c.Primary, c.Secondary, c.Relays-c.RelaysUnprotected)
	}
}

// goal says the row's goal, on the scale of the kept column (a time's goal of at most 1.5x
// unprotected is 0.67 kept), with its absolute limit, and whether it is met.
func goal(r workloads.Row) string {
	s := goalText(r.Measure)
	if s == "" {
		return ""
	}
	if r.GoalMet() {
		return s + ": met"
	}
	return s + ": **missed**"
}

// goalText is the measure's goal on the scale of the kept column, with its absolute limit ("" for
// a measure without a goal).
func goalText(m workloads.Measure) string {
	if m.Goal == 0 {
		return ""
	}
	s := fmt.Sprintf("≥ %.2f", keptGoal(m))
	if m.Limit != 0 {
		s += fmt.Sprintf(", ≤ %s %s", num(m.Limit), m.Unit)
	}
	return s
}

// keptGoal is the measure's goal as a share kept.
func keptGoal(m workloads.Measure) float64 {
	if m.HigherIsBetter {
		return m.Goal
	}
	return 1 / m.Goal
}

// num prints a figure with three significant digits or so.
func num(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}
