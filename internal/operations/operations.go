// Package operations decides the next step of a one-time operation on a pair (vSphere FT's test
// failover, test restart of the secondary, migration of the secondary) from the operation as
// recorded and the pair as observed. It is pure: the operator observes, asks Next, and carries
// the step out; each step is written before it is acted on, so that a crash at any point is
// followed by the same decision.
package operations

import "fmt"

// Type is an operation's type (the API's OperationType values).
type Type string

const (
	TestFailover         Type = "TestFailover"
	TestRestartSecondary Type = "TestRestartSecondary"
	MigrateSecondary     Type = "MigrateSecondary"
)

// Op is an operation as recorded in its status.
type Op struct {
	Type Type
	// Node is where MigrateSecondary asks the new secondary to go ("" for any node).
	Node string
	// Started: its status says Running; Primary and Secondary (with SecondaryNode) are the members
	// it started on.
	Started                           bool
	Primary, Secondary, SecondaryNode string
	// SecondaryUID tells the secondary it started on from a later one of the same name.
	SecondaryUID string
	// Recorded: the pair's record carries this operation's role change (a test failover).
	Recorded bool
}

// Member is a member of the pair as observed.
type Member struct {
	Name, Node, UID string
	// Running: its node is healthy and its VMI runs. Synced: it holds the primary's state.
	Running, Synced bool
}

// Pair is the pair as observed, after the operator's own decisions of this reconcile.
type Pair struct {
	// Active: the VM runs (runStrategy Running) with protection Enabled; operations wait otherwise.
	Active bool
	// Why the pair is not Active, or not Protected, for the waiting message.
	State string
	// Protected: a primary and a synchronized secondary, as the status says.
	Protected bool
	// Holder is the member the pair's record names.
	Holder             string
	Primary, Secondary *Member
}

// Action is what the operator does next.
type Action int

const (
	// Wait: nothing to do yet; Message says for what.
	Wait Action = iota
	// Start: write the operation Running, on the pair's current primary and secondary.
	Start
	// Promote: write the pair's record naming the secondary, with this operation; the role change
	// is then carried out as for any promotion.
	Promote
	// Drop: stop the secondary the operation started on; a new one is started.
	Drop
	// Succeed and Fail end the operation.
	Succeed
	Fail
)

func (a Action) String() string {
	return [...]string{"Wait", "Start", "Promote", "Drop", "Succeed", "Fail"}[a]
}

// Step is an action and what it says.
type Step struct {
	Action  Action
	Message string
}

// Next is the next step of op on pair p.
func Next(op Op, p Pair) Step {
	if !op.Started {
		return start(op, p)
	}
	if op.Type == TestFailover {
		return failover(op, p)
	}
	return replaceSecondary(op, p)
}

func start(op Op, p Pair) Step {
	switch {
	case !p.Active:
		return Step{Wait, fmt.Sprintf("waiting: the FaultTolerantVM is %s", p.State)}
	case !p.Protected || p.Primary == nil || p.Secondary == nil:
		return Step{Wait, fmt.Sprintf("waiting for the pair to be Protected (it is %s)", p.State)}
	case op.Type == MigrateSecondary && op.Node == p.Secondary.Node:
		return Step{Fail, fmt.Sprintf("the secondary %s already runs on node %s; nothing was changed", p.Secondary.Name, op.Node)}
	case op.Type == MigrateSecondary && op.Node == p.Primary.Node:
		return Step{Fail, fmt.Sprintf("node %s runs the primary %s, and the two members never share a node; nothing was changed", op.Node, p.Primary.Name)}
	}
	return Step{Start, fmt.Sprintf("started on primary %s (node %s) and secondary %s (node %s)",
		p.Primary.Name, p.Primary.Node, p.Secondary.Name, p.Secondary.Node)}
}

// failover: the record is written once, naming the secondary the operation started on, while
// that secondary still holds the primary's state and the primary it started on still holds the
// record. Any other change of the pair first means the test is moot, and it fails having changed
// nothing.
func failover(op Op, p Pair) Step {
	if op.Recorded {
		if p.Primary != nil && p.Primary.Name == op.Secondary && p.Protected && p.Secondary != nil {
			return Step{Succeed, fmt.Sprintf("secondary %s took over from %s; new secondary %s on node %s is synchronized",
				op.Secondary, op.Primary, p.Secondary.Name, p.Secondary.Node)}
		}
		return Step{Wait, fmt.Sprintf("secondary %s took over from %s; waiting for a new synchronized secondary", op.Secondary, op.Primary)}
	}
	switch {
	case p.Holder != op.Primary:
		return Step{Fail, fmt.Sprintf("the pair's record moved from %s to %s before the test failover: the pair failed over on its own; this operation changed nothing", op.Primary, orNone(p.Holder))}
	case p.Secondary == nil || p.Secondary.Name != op.Secondary:
		return Step{Fail, fmt.Sprintf("secondary %s is gone; this operation changed nothing", op.Secondary)}
	case !p.Secondary.Synced || !p.Secondary.Running:
		return Step{Fail, fmt.Sprintf("secondary %s no longer holds the primary's state; this operation changed nothing", op.Secondary)}
	case p.Primary == nil || p.Primary.Name != op.Primary || !p.Primary.Running:
		return Step{Fail, fmt.Sprintf("primary %s no longer runs; this operation changed nothing", op.Primary)}
	}
	return Step{Promote, fmt.Sprintf("promoting secondary %s (node %s) over primary %s (node %s)",
		op.Secondary, p.Secondary.Node, op.Primary, p.Primary.Node)}
}

// replaceSecondary: the secondary the operation started on is stopped, and the operation ends
// once another is synchronized (for a migration, on the node asked for, or on any other node).
func replaceSecondary(op Op, p Pair) Step {
	if p.Secondary != nil && p.Secondary.Name == op.Secondary && (op.SecondaryUID == "" || p.Secondary.UID == op.SecondaryUID) {
		return Step{Drop, fmt.Sprintf("stopping secondary %s on node %s", op.Secondary, op.SecondaryNode)}
	}
	if !p.Active {
		return Step{Fail, fmt.Sprintf("secondary %s was stopped, but the FaultTolerantVM is now %s: no new secondary is started", op.Secondary, p.State)}
	}
	if p.Secondary == nil || !p.Secondary.Synced || !p.Protected {
		where := ""
		if op.Type == MigrateSecondary && op.Node != "" {
			where = " on node " + op.Node
		}
		return Step{Wait, fmt.Sprintf("secondary %s stopped; waiting for a new secondary%s to synchronize", op.Secondary, where)}
	}
	if op.Type == MigrateSecondary && (op.Node != "" && p.Secondary.Node != op.Node || p.Secondary.Node == op.SecondaryNode) {
		return Step{Fail, fmt.Sprintf("the new secondary %s runs on node %s, not where the migration asked", p.Secondary.Name, p.Secondary.Node)}
	}
	return Step{Succeed, fmt.Sprintf("secondary %s on node %s replaced %s on node %s and is synchronized",
		p.Secondary.Name, p.Secondary.Node, op.Secondary, op.SecondaryNode)}
}

// Placement is where the pair's next secondary may go while op runs: Node is required ("" for
// any), Avoid is excluded.
func Placement(op Op) (node, avoid string) {
	if op.Type != MigrateSecondary || !op.Started {
		return "", ""
	}
	return op.Node, op.SecondaryNode
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
