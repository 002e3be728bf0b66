// Package chaos is lockstep's seeded chaos suite: a schedule of faults chosen by a seed, run
// against the local cluster (hack/local-cluster.sh) while an invariant monitor watches the API.
// schedule.go is the pure part: the schedule a seed gives.
package chaos

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Action is one kind of step.
type Action string

// The steps of a schedule.
const (
	KillNode     Action = "kill-node"     // the node's host dies
	ReviveNode   Action = "revive-node"   // it comes back
	FlapNode     Action = "flap-node"     // it stops answering for Hold, then comes back
	AddNode      Action = "add-node"      // a new node joins
	KillOperator Action = "kill-operator" // SIGKILL, started again after Hold
	// KillMidFailover kills the node of a primary, waits until the operator starts failing it
	// over, and SIGKILLs the operator right then.
	KillMidFailover Action = "kill-operator-mid-failover"
	Create          Action = "create-ftvm"
	Delete          Action = "delete-ftvm"
	Halt            Action = "halt-ftvm"
	Run             Action = "run-ftvm"
	Wait            Action = "wait"
)

// Step is one step of a schedule.
type Step struct {
	N      int
	Action Action
	// Target is a node or a FaultTolerantVM name.
	Target string
	// VCPUs of a FaultTolerantVM to create.
	VCPUs int
	// Hold is how long a flap lasts, how long the operator stays dead, or how long to wait.
	Hold time.Duration
	// Skew is how far a clock is set off (skew-clock).
	Skew time.Duration
}

func (s Step) String() string {
	out := fmt.Sprintf("%3d %s", s.N, s.Action)
	if s.Target != "" {
		out += " " + s.Target
	}
	if s.VCPUs > 0 {
		out += fmt.Sprintf(" (%d vCPUs)", s.VCPUs)
	}
	if s.Hold > 0 {
		out += " " + s.Hold.String()
	}
	if s.Skew != 0 {
		out += fmt.Sprintf(" clock %+ds", int(s.Skew.Seconds()))
	}
	return out
}

// Model is what the schedule knows of the cluster while it is drawn.
type Model struct {
	Nodes   int // node-1 .. node-Nodes exist
	MaxVMs  int // FaultTolerantVMs alive at most
	MaxNode int // nodes at most
}

// Schedule draws steps from seed. It tracks which nodes it killed and which FaultTolerantVMs it
// made, so that every step names a real target, and it keeps at least three nodes alive.
func Schedule(seed uint64, steps int, m Model) []Step {
	d := &drawer{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), m: m, nodes: m.Nodes,
		dead: map[string]bool{}, vms: map[string]bool{}, nextVM: 1}
	out := make([]Step, 0, steps)
	// A few VMs first, and time for them to be Protected, so that the faults find pairs to break.
	for i := 0; i < 4 && len(out) < steps; i++ {
		s := Step{N: len(out) + 1, Action: Create, Target: fmt.Sprintf("vm-%03d", d.nextVM), VCPUs: 1 + d.r.IntN(4)}
		d.vms[s.Target] = true
		d.nextVM++
		out = append(out, s)
	}
	if len(out) < steps {
		out = append(out, Step{N: len(out) + 1, Action: Wait, Hold: 10 * time.Second})
	}
	for len(out) < steps {
		s := d.draw()
		s.N = len(out) + 1
		out = append(out, s)
	}
	return out
}

// drawer is the schedule's model of the cluster while it draws.
type drawer struct {
	r      *rand.Rand
	m      Model
	nodes  int
	dead   map[string]bool
	vms    map[string]bool // name -> runs
	nextVM int
}

func (d *drawer) alive() []string {
	var out []string
	for i := 1; i <= d.nodes; i++ {
		if n := fmt.Sprintf("node-%d", i); !d.dead[n] {
			out = append(out, n)
		}
	}
	return out
}

// pick is a random key of set whose value is want ("" when none).
func (d *drawer) pick(set map[string]bool, want bool) string {
	var c []string
	for k, v := range set {
		if v == want {
			c = append(c, k)
		}
	}
	if len(c) == 0 {
		return ""
	}
	sortStrings(c)
	return c[d.r.IntN(len(c))]
}

func (d *drawer) hold(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(d.r.Int64N(int64(hi-lo)))
}

func (d *drawer) draw() Step {
	x := d.r.IntN(100)
	spare := len(d.alive()) > 3
	switch {
	case x < 12 && spare:
		a := d.alive()
		s := Step{Action: KillNode, Target: a[d.r.IntN(len(a))]}
		d.dead[s.Target] = true
		return s
	case x < 20 && len(d.dead) > 0:
		s := Step{Action: ReviveNode, Target: d.pick(d.dead, true)}
		delete(d.dead, s.Target)
		return s
	case x < 33 && spare:
		a := d.alive()
		// Some flaps end before the node is declared lost (8 s, then the operator's 5 s), some after.
		return Step{Action: FlapNode, Target: a[d.r.IntN(len(a))], Hold: d.hold(2*time.Second, 25*time.Second)}
	case x < 37 && d.nodes < d.m.MaxNode:
		d.nodes++
		return Step{Action: AddNode, Target: fmt.Sprintf("node-%d", d.nodes)}
	case x < 45:
		return Step{Action: KillOperator, Hold: d.hold(0, 3*time.Second)}
	case x < 50 && spare && len(d.vms) > 0:
		// The node is chosen when the step runs (the node of a running primary).
		return Step{Action: KillMidFailover, Hold: d.hold(0, 3*time.Second)}
	case x < 66 && len(d.vms) < d.m.MaxVMs:
		s := Step{Action: Create, Target: fmt.Sprintf("vm-%03d", d.nextVM), VCPUs: 1 + d.r.IntN(4)}
		d.vms[s.Target] = true
		d.nextVM++
		return s
	case x < 74 && len(d.vms) > 0:
		s := Step{Action: Delete, Target: d.pick(d.vms, true)}
		if s.Target == "" {
			s.Target = d.pick(d.vms, false)
		}
		delete(d.vms, s.Target)
		return s
	case x < 80 && d.pick(d.vms, true) != "":
		s := Step{Action: Halt, Target: d.pick(d.vms, true)}
		d.vms[s.Target] = false
		return s
	case x < 86 && d.pick(d.vms, false) != "":
		s := Step{Action: Run, Target: d.pick(d.vms, false)}
		d.vms[s.Target] = true
		return s
	}
	return Step{Action: Wait, Hold: d.hold(time.Second, 10*time.Second)}
}

// Format prints a schedule, a step a line.
func Format(seed uint64, steps []Step) string {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos schedule, seed %d (CHAOS_SEED=%d CHAOS_STEPS=%d make test-chaos repeats it):\n", seed, seed, len(steps))
	writeSteps(&b, steps)
	return b.String()
}

// writeSteps lists steps, one to a line, as a report prints them.
func writeSteps(b *strings.Builder, steps []Step) {
	for _, s := range steps {
		b.WriteString("  " + s.String() + "\n")
	}
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}
