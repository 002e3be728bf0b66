// The kept column of several runs of make bench-workloads side by side: whether a row's cost is
// the same from one run to the next on this machine.

package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/lockstep-dev/lockstep/test/workloads"
)

// acrossReport writes, for every row of any report, what each report kept of it.
func acrossReport(w io.Writer, files []string) error {
	reports := make([]workloads.Report, 0, len(files))
	for _, f := range files {
		r, err := workloads.ReadReport(f)
		if err != nil {
			return err
		}
		reports = append(reports, r)
	}
	return across(w, reports)
}

// across writes the table: a column per run (its date and commit), a line per row and measure,
// each cell the share kept and, beside the goal, whether each run met it.
func across(w io.Writer, reports []workloads.Report) error {
	if len(reports) == 0 {
		return fmt.Errorf("no reports")
	}
	var b strings.Builder
	b.WriteString("| workload | measure | goal |")
	for _, r := range reports {
		pinned := ""
		if r.Pinned {
			pinned = ", pinned"
		}
		fmt.Fprintf(&b, " kept, %s (%s%s) |", r.Date, r.Commit, pinned)
	}
	b.WriteString("\n| --- | --- | --- |" + strings.Repeat(" ---: |", len(reports)) + "\n")
	for _, row := range allRows(reports) {
		fmt.Fprintf(&b, "| %s | %s | %s |", row.Workload, row.Measure.Name, goalText(row.Measure))
		for _, r := range reports {
			other, ok := find(r, row.Workload, row.Measure.Name)
			switch {
			case !ok:
				b.WriteString(" not run |")
			case other.Protection.Checkpoints == 0:
				// No checkpoint in its protected run: the pair did not replicate, and the
				// figure is not protection's cost (make bench-workloads now fails such a run).
				b.WriteString(" no checkpoint: not protected |")
			case !other.GoalMet(): // true where the row has no goal
				fmt.Fprintf(&b, " %.2f (missed) |", other.Kept())
			default:
				fmt.Fprintf(&b, " %.2f |", other.Kept())
			}
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// allRows is every row and measure of the reports, once each: the first report's in its order,
// then those that only later reports have (a row added since), in theirs.
func allRows(reports []workloads.Report) []workloads.Row {
	var rows []workloads.Row
	seen := map[[2]string]bool{}
	for _, r := range reports {
		for _, row := range r.Rows {
			if k := [2]string{row.Workload, row.Measure.Name}; !seen[k] {
				seen[k] = true
				rows = append(rows, row)
			}
		}
	}
	return rows
}

// find is the report's row of that workload and measure.
func find(r workloads.Report, workload, measure string) (workloads.Row, bool) {
	for _, row := range r.Rows {
		if row.Workload == workload && row.Measure.Name == measure {
			return row, true
		}
	}
	return workloads.Row{}, false
}
