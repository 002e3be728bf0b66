package chaos

import (
	"reflect"
	"testing"
)

func TestScheduleIsTheSeeds(t *testing.T) {
	m := Model{Nodes: 8, MaxVMs: 10, MaxNode: 12}
	a, b := Schedule(42, 200, m), Schedule(42, 200, m)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed gave two schedules")
	}
	if reflect.DeepEqual(a, Schedule(43, 200, m)) {
		t.Fatal("two seeds gave one schedule")
	}
	seen := map[Action]bool{}
	dead := map[string]bool{}
	for _, s := range a {
		seen[s.Action] = true
		switch s.Action {
		case KillNode:
			if dead[s.Target] {
				t.Fatalf("step %d kills a dead node", s.N)
			}
			dead[s.Target] = true
		case ReviveNode:
			if !dead[s.Target] {
				t.Fatalf("step %d revives a live node", s.N)
			}
			delete(dead, s.Target)
		}
	}
	for _, want := range []Action{KillNode, ReviveNode, FlapNode, KillOperator, KillMidFailover, Create, Delete, Halt, Run} {
		if !seen[want] {
			t.Errorf("200 steps of seed 42 have no %s", want)
		}
	}
}
