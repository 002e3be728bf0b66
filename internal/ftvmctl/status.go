// Package ftvmctl is the kubectl plugin (kubectl ftvm): the status of protected VMs as a person
// reads it, the console of the member that runs the VM, and the day-two operations, each one an
// object the operator acts on (FaultTolerantVMOperation, spec.protection), never an action of
// its own.
package ftvmctl

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/duration"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// Row is one FaultTolerantVM as `kubectl ftvm status` lists it.
type Row struct {
	Namespace, Name string
	State           string
	// Primary and Secondary are "<vmi>@<node>" ("-": none).
	Primary, Secondary string
	// Synced: the secondary's lockstepd reports it synchronized ("yes", "no", "-").
	Synced string
	// Resync is a running resync's progress ("42% 1.2Gi/2.9Gi, 3m left") or "-".
	Resync string
	// Pause is the checkpoints' pause of the VM ("3ms") or "-"; Interval the vLockstep interval.
	Pause, Interval string
	Failovers       int32
	Age             string
}

// Summarize is the row of f, as of now.
func Summarize(f *ftv1.FaultTolerantVM, now time.Time) Row {
	r := Row{Namespace: f.Namespace, Name: f.Name, State: string(f.Status.State), Primary: member(f.Status.Primary),
		Secondary: member(f.Status.Secondary), Synced: "-", Resync: "-", Pause: "-", Interval: "-",
		Failovers: f.Status.FailoverCount, Age: duration.HumanDuration(now.Sub(f.CreationTimestamp.Time))}
	if r.State == "" {
		r.State = "-"
	}
	if s := secondarySide(f); s != nil {
		r.Synced = map[bool]string{true: "yes", false: "no"}[s.Synchronized]
	}
	if rs := f.Status.Resync; rs != nil && rs.DoneBytes != nil && rs.TotalBytes != nil && *rs.TotalBytes > 0 {
		r.Resync = fmt.Sprintf("%d%% %s/%s", *rs.DoneBytes*100 / *rs.TotalBytes, binarySize(*rs.DoneBytes), binarySize(*rs.TotalBytes))
		if eta := rs.EstimatedCompletionTime; eta != nil && eta.After(now) {
			r.Resync += ", " + duration.HumanDuration(eta.Sub(now)) + " left"
		}
	}
	if c := f.Status.Checkpoints; c != nil && c.PauseMilliseconds != nil {
		r.Pause = fmt.Sprintf("%dms", *c.PauseMilliseconds)
	}
	if f.Status.VLockstepInterval != nil {
		r.Interval = f.Status.VLockstepInterval.Round(time.Millisecond).String()
	}
	return r
}

// secondarySide is lockstepd's report of the pair's current secondary (nil: none, or a report of
// an earlier one).
func secondarySide(f *ftv1.FaultTolerantVM) *ftv1.SideStatus {
	r, s := f.Status.Replication, f.Status.Secondary
	if r == nil || r.Secondary == nil || s == nil || r.Secondary.VMI != s.VMI {
		return nil
	}
	return r.Secondary
}

func member(m *ftv1.MemberStatus) string {
	if m == nil || m.VMI == "" {
		return "-"
	}
	return m.VMI + "@" + m.Node
}

// binarySize is n in binary units, one decimal ("1.5Gi").
func binarySize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	v, i := float64(n), -1
	for v >= unit && i < 4 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f%si", v, "KMGTP"[i:i+1])
}

// printer writes to w and keeps the first error.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) f(format string, a ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, a...)
	}
}

// flush ends a table: the first error, or tw's own.
func (p *printer) flush(tw *tabwriter.Writer) error {
	if p.err != nil {
		return p.err
	}
	return tw.Flush()
}

// PrintTable writes the rows as kubectl lists objects; allNamespaces adds the namespace.
func PrintTable(w io.Writer, rows []Row, allNamespaces bool) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	p := &printer{w: tw}
	head := "NAME\tSTATE\tPRIMARY\tSECONDARY\tSYNCED\tRESYNC\tPAUSE\tINTERVAL\tFAILOVERS\tAGE"
	if allNamespaces {
		head = "NAMESPACE\t" + head
	}
	p.f("%s\n", head)
	for _, r := range rows {
		line := strings.Join([]string{r.Name, r.State, r.Primary, r.Secondary, r.Synced, r.Resync, r.Pause, r.Interval,
			fmt.Sprint(r.Failovers), r.Age}, "\t")
		if allNamespaces {
			line = r.Namespace + "\t" + line
		}
		p.f("%s\n", line)
	}
	return p.flush(tw)
}

// Describe writes one FaultTolerantVM in full: its row, each side as its lockstepd reports it,
// the last resync and the conditions with their reasons.
func Describe(w io.Writer, f *ftv1.FaultTolerantVM, now time.Time) error {
	r := Summarize(f, now)
	p := &printer{w: w}
	p.f("Name:        %s/%s\nState:       %s\nPrimary:     %s\nSecondary:   %s (synchronized: %s)\n",
		f.Namespace, f.Name, r.State, r.Primary, r.Secondary, r.Synced)
	p.f("Protection:  %s, runStrategy %s\nFailovers:   %d", orDash(string(f.Spec.Protection)), orDash(string(f.Spec.RunStrategy)), r.Failovers)
	if t := f.Status.LastFailoverTime; t != nil {
		p.f(" (last %s ago)", duration.HumanDuration(now.Sub(t.Time)))
	}
	p.f("\nInterval:    %s\nPause:       %s\nResync:      %s\n", r.Interval, r.Pause, r.Resync)
	if lr := f.Status.LastResync; lr != nil {
		kind := "whole"
		if lr.Incremental != nil && *lr.Incremental {
			kind = "incremental"
		}
		copied := "-"
		if lr.CopiedBytes != nil {
			copied = binarySize(*lr.CopiedBytes)
		}
		p.f("Last resync: %s into %s, %s", kind, lr.Secondary, copied)
		if lr.DurationMilliseconds != nil {
			p.f(" in %s", (time.Duration(*lr.DurationMilliseconds) * time.Millisecond).String())
		}
		p.f("\n")
	}
	if rep := f.Status.Replication; rep != nil {
		p.f("Sides (lockstepd):\n")
		for _, s := range []struct {
			role string
			side *ftv1.SideStatus
		}{{"primary", rep.Primary}, {"secondary", rep.Secondary}} {
			if s.side == nil {
				continue
			}
			p.f("  %-9s  %s@%s  %s, epoch %d, connected %t, held outputs %d, reported %s ago",
				s.role, s.side.VMI, s.side.Node, s.side.State, s.side.Epoch, s.side.Connected, s.side.HeldOutputs,
				duration.HumanDuration(now.Sub(s.side.ReportTime.Time)))
			if s.side.Message != "" {
				p.f(": %s", s.side.Message)
			}
			p.f("\n")
		}
	}
	p.f("Conditions:\n")
	if p.err != nil {
		return p.err
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	p = &printer{w: tw}
	p.f("  TYPE\tSTATUS\tREASON\tSINCE\tMESSAGE\n")
	for _, typ := range []string{ftv1.ConditionValid, ftv1.ConditionPrimaryReady, ftv1.ConditionSecondaryReady, ftv1.ConditionProtected,
		ftv1.ConditionMemberFenced, ftv1.ConditionRestartRequired} {
		c := apimeta.FindStatusCondition(f.Status.Conditions, typ)
		if c == nil {
			continue
		}
		p.f("  %s\t%s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, duration.HumanDuration(now.Sub(c.LastTransitionTime.Time)), c.Message)
	}
	return p.flush(tw)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
