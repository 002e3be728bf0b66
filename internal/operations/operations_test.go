package operations

import (
	"strings"
	"testing"
)

func TestNext(t *testing.T) {
	p1 := &Member{Name: "vm-1", Node: "n1", Running: true, Synced: true}
	s2 := &Member{Name: "vm-2", Node: "n2", Running: true, Synced: true}
	s3 := &Member{Name: "vm-3", Node: "n3", Running: true, Synced: true}
	unsynced3 := &Member{Name: "vm-3", Node: "n3", Running: true}
	p2 := &Member{Name: "vm-2", Node: "n2", Running: true, Synced: true}
	protected := Pair{Active: true, State: "Protected", Protected: true, Holder: "vm-1", Primary: p1, Secondary: s2}
	started := func(t Type) Op {
		return Op{Type: t, Started: true, Primary: "vm-1", Secondary: "vm-2", SecondaryNode: "n2"}
	}
	cases := []struct {
		name string
		op   Op
		pair Pair
		want Action
		says string
	}{
		{"a halted VM waits", Op{Type: TestFailover}, Pair{State: "Stopped"}, Wait, "is Stopped"},
		{"a pair not yet protected waits", Op{Type: TestFailover}, Pair{Active: true, State: "Starting", Primary: p1}, Wait, "to be Protected"},
		{"a protected pair starts", Op{Type: TestFailover}, protected, Start, "primary vm-1 (node n1) and secondary vm-2 (node n2)"},
		{"a migration to the secondary's node fails", Op{Type: MigrateSecondary, Node: "n2"}, protected, Fail, "already runs on node n2"},
		{"a migration to the primary's node fails", Op{Type: MigrateSecondary, Node: "n1"}, protected, Fail, "never share a node"},
		{"a migration elsewhere starts", Op{Type: MigrateSecondary, Node: "n3"}, protected, Start, "started"},

		{"failover: the record is written", started(TestFailover), protected, Promote, "promoting secondary vm-2"},
		{"failover: the pair failed over on its own first", started(TestFailover),
			Pair{Active: true, Holder: "vm-2", Primary: p2}, Fail, "failed over on its own"},
		{"failover: the secondary is gone", started(TestFailover),
			Pair{Active: true, Holder: "vm-1", Primary: p1, Secondary: s3}, Fail, "vm-2 is gone"},
		{"failover: the secondary lost sync", started(TestFailover),
			Pair{Active: true, Holder: "vm-1", Primary: p1, Secondary: &Member{Name: "vm-2", Node: "n2", Running: true}}, Fail, "no longer holds"},
		{"failover: the primary is not running", started(TestFailover),
			Pair{Active: true, Holder: "vm-1", Primary: &Member{Name: "vm-1", Node: "n1"}, Secondary: s2}, Fail, "no longer runs"},
		{"failover recorded: waits for the new secondary", Op{Type: TestFailover, Started: true, Recorded: true, Primary: "vm-1", Secondary: "vm-2"},
			Pair{Active: true, Holder: "vm-2", Primary: p2, Secondary: unsynced3}, Wait, "waiting for a new synchronized secondary"},
		{"failover recorded: done once protected again", Op{Type: TestFailover, Started: true, Recorded: true, Primary: "vm-1", Secondary: "vm-2"},
			Pair{Active: true, Protected: true, Holder: "vm-2", Primary: p2, Secondary: s3}, Succeed, "vm-2 took over from vm-1; new secondary vm-3 on node n3"},
		{"failover recorded: never promotes twice", Op{Type: TestFailover, Started: true, Recorded: true, Primary: "vm-1", Secondary: "vm-2"},
			protected, Wait, "waiting"},

		{"restart: the secondary is stopped", started(TestRestartSecondary), protected, Drop, "stopping secondary vm-2 on node n2"},
		{"restart: waits for the new one", started(TestRestartSecondary),
			Pair{Active: true, Holder: "vm-1", Primary: p1, Secondary: unsynced3}, Wait, "waiting for a new secondary to synchronize"},
		{"restart: done", started(TestRestartSecondary),
			Pair{Active: true, Protected: true, Holder: "vm-1", Primary: p1, Secondary: s3}, Succeed, "vm-3 on node n3 replaced vm-2 on node n2"},
		{"restart: a new secondary of the same name is not stopped again", Op{Type: TestRestartSecondary, Started: true, Primary: "vm-1", Secondary: "vm-2", SecondaryNode: "n2", SecondaryUID: "old"},
			Pair{Active: true, Protected: true, Holder: "vm-1", Primary: p1, Secondary: &Member{Name: "vm-2", Node: "n3", UID: "new", Running: true, Synced: true}}, Succeed, "replaced vm-2 on node n2"},
		{"restart: halted meanwhile", started(TestRestartSecondary), Pair{State: "Stopped"}, Fail, "now Stopped"},
		{"migrate: waits on the node asked for", Op{Type: MigrateSecondary, Node: "n3", Started: true, Primary: "vm-1", Secondary: "vm-2", SecondaryNode: "n2"},
			Pair{Active: true, Holder: "vm-1", Primary: p1}, Wait, "on node n3"},
		{"migrate: done on the node asked for", Op{Type: MigrateSecondary, Node: "n3", Started: true, Primary: "vm-1", Secondary: "vm-2", SecondaryNode: "n2"},
			Pair{Active: true, Protected: true, Holder: "vm-1", Primary: p1, Secondary: s3}, Succeed, "replaced"},
		{"migrate: a secondary elsewhere is not what was asked", Op{Type: MigrateSecondary, Node: "n4", Started: true, Primary: "vm-1", Secondary: "vm-2", SecondaryNode: "n2"},
			Pair{Active: true, Protected: true, Holder: "vm-1", Primary: p1, Secondary: s3}, Fail, "not where the migration asked"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Next(c.op, c.pair)
			if got.Action != c.want || !strings.Contains(got.Message, c.says) {
				t.Fatalf("Next = %s %q, want %s containing %q", got.Action, got.Message, c.want, c.says)
			}
		})
	}
}

func TestPlacement(t *testing.T) {
	if n, a := Placement(Op{Type: MigrateSecondary, Node: "n3", Started: true, SecondaryNode: "n2"}); n != "n3" || a != "n2" {
		t.Fatalf("a running migration: %q %q", n, a)
	}
	if n, a := Placement(Op{Type: MigrateSecondary, Node: "n3"}); n != "" || a != "" {
		t.Fatalf("a pending migration constrains nothing: %q %q", n, a)
	}
	if n, a := Placement(Op{Type: TestRestartSecondary, Started: true, SecondaryNode: "n2"}); n != "" || a != "" {
		t.Fatalf("a restart constrains nothing: %q %q", n, a)
	}
}
