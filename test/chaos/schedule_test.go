package chaos

import (
	"reflect"
	"testing"
	"time"
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

// A schedule cut short by the budget is the schedule of its length: CHAOS_STEPS=k repeats the k
// steps that ran.
func TestAShorterScheduleIsTheLongersStart(t *testing.T) {
	m := Model{Nodes: 8, MaxVMs: 10, MaxNode: 12}
	long := Schedule(501909, 40, m)
	for _, k := range []int{1, 5, 20, 27, 39} {
		if got := Schedule(501909, k, m); !reflect.DeepEqual(got, long[:k]) {
			t.Fatalf("the first %d steps of seed 501909 differ from its schedule of %d", k, k)
		}
	}
}

func TestFullStackScheduleIsTheSeeds(t *testing.T) {
	a, b := FullStackSchedule(7, 100, all), FullStackSchedule(7, 100, all)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed gave two schedules")
	}
	if reflect.DeepEqual(a, FullStackSchedule(8, 100, all)) {
		t.Fatal("two seeds gave one schedule")
	}
	seen := map[string]bool{}
	for i, s := range a {
		if s.N != i+1 {
			t.Fatalf("step %d is numbered %d", i+1, s.N)
		}
		seen[string(s.Action)+" "+s.Target] = true
		if (s.Action == PartitionLogging || s.Action == KillOperator || s.Action == CutAPI) != (s.Hold > 0) {
			t.Fatalf("step %d: %s with hold %s", s.N, s.Action, s.Hold)
		}
		if (s.Action == SkewClock) != (s.Skew != 0) || s.Skew.Abs() > 4*time.Minute || s.Skew != 0 && s.Skew.Abs() < time.Minute {
			t.Fatalf("step %d: %s with skew %s", s.N, s.Action, s.Skew)
		}
		if s.Skew < 0 {
			seen["skew-clock behind"] = true
		} else if s.Skew > 0 {
			seen["skew-clock ahead"] = true
		}
	}
	for _, want := range []string{"kill-qemu primary", "kill-qemu secondary", "kill-lockstepd primary", "kill-lockstepd secondary",
		"partition-logging primary", "partition-logging secondary", "kill-member-node primary", "kill-member-node secondary",
		"cut-api primary", "cut-api secondary", "skew-clock primary", "skew-clock secondary", "skew-clock behind", "skew-clock ahead", "kill-operator "} {
		if !seen[want] {
			t.Errorf("100 steps of seed 7 have no %q", want)
		}
	}
}

// Without cut-api or skew-clock, a seed draws every other action, and neither; with cut-api
// alone, the schedule it drew before skew-clock was added.
func TestFullStackScheduleWithoutCutAPI(t *testing.T) {
	seen := map[Action]bool{}
	for _, s := range FullStackSchedule(7, 200, FullStackFaults{}) {
		seen[s.Action] = true
	}
	if seen[CutAPI] || seen[SkewClock] {
		t.Fatal("a schedule without cut-api and skew-clock has one of them")
	}
	withCut := FullStackSchedule(7, 200, FullStackFaults{CutAPI: true})
	withBoth := FullStackSchedule(7, 200, all)
	same := 0
	for i := range withCut {
		if withCut[i] == withBoth[i] {
			same++
		} else if withBoth[i].Action != SkewClock {
			t.Fatalf("step %d: %s with skew-clock asked for, %s without: only skew-clock steps may differ", i+1, withBoth[i], withCut[i])
		}
	}
	if same == len(withCut) {
		t.Fatal("asking for skew-clock changed no step")
	}
	for _, a := range []Action{KillQEMU, KillLockstepd, PartitionLogging, KillMemberNode, KillOperator} {
		if !seen[a] {
			t.Errorf("200 steps of seed 7 without cut-api have no %s", a)
		}
	}
}

// all asks for every fault a full-stack schedule can draw.
var all = FullStackFaults{CutAPI: true, ClockSkew: true}

func TestBudgetFromEnv(t *testing.T) {
	for _, c := range []struct {
		budget, steps string
		want          time.Duration
		err           bool
	}{
		{want: 3 * time.Minute}, // the default length: the default budget
		{steps: "40"},           // a length asked for runs whole
		{budget: "90s", steps: "40", want: 90 * time.Second},
		{budget: "0"},
		{budget: "soon", err: true},
	} {
		t.Setenv("T_BUDGET", c.budget)
		t.Setenv("T_STEPS", c.steps)
		got, err := BudgetFromEnv("T_BUDGET", "T_STEPS", 3*time.Minute)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("budget %q, steps %q: %s, %v; want %s", c.budget, c.steps, got, err, c.want)
		}
	}
}
