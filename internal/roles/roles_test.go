package roles

import (
	"reflect"
	"testing"
)

func TestDecide(t *testing.T) {
	p1 := Member{Name: "vm-1", Ordinal: 1, Role: Primary, Health: Running, Epoch: 1}
	s2 := Member{Name: "vm-2", Ordinal: 2, Role: Secondary, Health: Running, Synced: true}
	held := func(holder string, epoch int64) Record { return Record{Exists: true, Holder: holder, Epoch: epoch} }
	with := func(m Member, f func(*Member)) Member { f(&m); return m }
	lost := func(m *Member) { m.Health = Lost }
	suspect := func(m *Member) { m.Health = Suspect }
	unsynced := func(m *Member) { m.Synced = false }

	cases := []struct {
		name    string
		rec     Record
		members []Member
		want    Plan
	}{{
		name: "a new pair starts, and its primary will take the record",
		rec:  Record{},
		want: Plan{Restart: true},
	}, {
		name:    "a protected pair: nothing to do",
		rec:     held("vm-1", 1),
		members: []Member{p1, s2},
		want:    Plan{Primary: "vm-1", Secondary: "vm-2"},
	}, {
		name:    "a pending secondary is kept",
		rec:     held("vm-1", 1),
		members: []Member{p1, with(s2, func(m *Member) { m.Health, m.Synced = Pending, false })},
		want:    Plan{Primary: "vm-1", Secondary: "vm-2"},
	}, {
		name:    "the primary is lost: the synchronized secondary is promoted at the next epoch, counted once",
		rec:     held("vm-1", 1),
		members: []Member{with(p1, lost), s2},
		want: Plan{Record: &Record{Exists: true, Holder: "vm-2", Epoch: 2, Promotions: 1, LastPromoted: "vm-2"},
			Promoted: "vm-2", Relabel: "vm-2", Primary: "vm-2",
			Fence: []Fence{{Name: "vm-1", Why: "primary vm-1 was lost; vm-2 runs the VM from epoch 2"}}},
	}, {
		name: "after a crash between the record and the relabel: relabel, fence, and no second count",
		rec:  Record{Exists: true, Holder: "vm-2", Epoch: 2, Promotions: 1, LastPromoted: "vm-2"},
		// The old primary, on a lost node, is still labelled primary.
		members: []Member{with(p1, lost), s2},
		want: Plan{Relabel: "vm-2", Primary: "vm-2",
			Fence: []Fence{{Name: "vm-1", Why: "primary vm-1 was superseded; vm-2 runs the VM from epoch 2"}}},
	}, {
		name:    "after a crash between the relabel and the fence: the old primary, labelled fenced, goes",
		rec:     Record{Exists: true, Holder: "vm-2", Epoch: 2, Promotions: 1, LastPromoted: "vm-2"},
		members: []Member{with(p1, func(m *Member) { m.Role, m.Health = Fenced, Lost }), with(s2, func(m *Member) { m.Role = Primary })},
		want:    Plan{Primary: "vm-2", Fence: []Fence{{Name: "vm-1", Why: "vm-1 was fenced"}}},
	}, {
		name:    "lockstepd's secondary won the Lease: the operator follows and counts it",
		rec:     held("vm-2", 2),
		members: []Member{p1, s2},
		want: Plan{Record: &Record{Exists: true, Holder: "vm-2", Epoch: 2, Promotions: 1, LastPromoted: "vm-2"},
			Promoted: "vm-2", Relabel: "vm-2", Primary: "vm-2",
			Fence: []Fence{{Name: "vm-1", Why: "primary vm-1 was superseded; vm-2 runs the VM from epoch 2"}}},
	}, {
		name:    "the primary is lost and its secondary never synchronized: release the record, restart from disk",
		rec:     held("vm-1", 1),
		members: []Member{with(p1, lost), with(s2, unsynced)},
		want: Plan{Record: &Record{Exists: true, Epoch: 2}, Restart: true,
			Fence: []Fence{{Name: "vm-1", Why: "primary vm-1 was lost; no synchronized secondary can take over: the VM restarts from its disks"}},
			Drop:  []Drop{{Name: "vm-2", Why: "secondary vm-2 never synchronized, and its primary was lost: the VM restarts from its disks"}}},
	}, {
		name:    "the primary is lost with no secondary",
		rec:     held("vm-1", 1),
		members: []Member{with(p1, lost)},
		want: Plan{Record: &Record{Exists: true, Epoch: 2}, Restart: true,
			Fence: []Fence{{Name: "vm-1", Why: "primary vm-1 was lost; no synchronized secondary can take over: the VM restarts from its disks"}}},
	}, {
		name:    "the primary is lost and its synchronized secondary is suspect: wait, do not lose the VM's memory",
		rec:     held("vm-1", 1),
		members: []Member{with(p1, lost), with(s2, suspect)},
		want:    Plan{Primary: "vm-1", Secondary: "vm-2", Waiting: true},
	}, {
		name:    "the record was released for a restart: a member still labelled primary is fenced, nothing is promoted twice",
		rec:     Record{Exists: true, Epoch: 2},
		members: []Member{with(p1, lost)},
		want: Plan{Restart: true,
			Fence: []Fence{{Name: "vm-1", Duplicate: true, Why: "vm-1 is labelled primary but does not hold the pair's record (epoch 2, no holder)"}}},
	}, {
		name:    "the holder was deleted by hand: its synchronized secondary takes over",
		rec:     held("vm-1", 1),
		members: []Member{s2},
		want: Plan{Record: &Record{Exists: true, Holder: "vm-2", Epoch: 2, Promotions: 1, LastPromoted: "vm-2"},
			Promoted: "vm-2", Relabel: "vm-2", Primary: "vm-2"},
	}, {
		name: "two members labelled primary: the holder stays, the other is fenced, no third is started",
		rec:  held("vm-3", 3),
		members: []Member{p1, with(s2, func(m *Member) { m.Role = Primary }),
			{Name: "vm-3", Ordinal: 3, Role: Primary, Health: Running, Epoch: 3}},
		want: Plan{Primary: "vm-3", Fence: []Fence{
			{Name: "vm-1", Duplicate: true, Why: "vm-1 is labelled primary but does not hold the pair's record (epoch 3, held by vm-3)"},
			{Name: "vm-2", Duplicate: true, Why: "vm-2 is labelled primary but does not hold the pair's record (epoch 3, held by vm-3)"}}},
	}, {
		name: "no record (an older version) and two members labelled primary: the newest epoch wins",
		rec:  Record{Promotions: 4},
		members: []Member{with(p1, func(m *Member) { m.Epoch = 0 }),
			{Name: "vm-2", Ordinal: 2, Role: Primary, Health: Running, Epoch: 5}},
		want: Plan{Record: &Record{Exists: true, Holder: "vm-2", Epoch: 6, Promotions: 4}, Primary: "vm-2",
			Fence: []Fence{{Name: "vm-1", Duplicate: true, Why: "vm-1 is labelled primary but does not hold the pair's record (epoch 6, held by vm-2)"}}},
	}, {
		name: "no record and no epochs: a running primary is preferred to a lost one",
		rec:  Record{},
		members: []Member{with(p1, func(m *Member) { m.Epoch, m.Health = 0, Lost }),
			{Name: "vm-2", Ordinal: 2, Role: Primary, Health: Running}},
		want: Plan{Record: &Record{Exists: true, Holder: "vm-2", Epoch: 1}, Primary: "vm-2",
			Fence: []Fence{{Name: "vm-1", Duplicate: true, Why: "vm-1 is labelled primary but does not hold the pair's record (epoch 1, held by vm-2)"}}},
	}, {
		name:    "a lost secondary is dropped",
		rec:     held("vm-1", 1),
		members: []Member{p1, with(s2, lost)},
		want:    Plan{Primary: "vm-1", Drop: []Drop{{Name: "vm-2", Why: "secondary vm-2 is Lost"}}},
	}, {
		name:    "a surplus secondary is dropped",
		rec:     held("vm-1", 1),
		members: []Member{p1, s2, {Name: "vm-3", Ordinal: 3, Role: Secondary, Health: Running}},
		want:    Plan{Primary: "vm-1", Secondary: "vm-2", Drop: []Drop{{Name: "vm-3", Why: "secondary vm-3 is surplus: vm-2 is the pair's secondary"}}},
	}, {
		name:    "lockstepd's secondary won the Lease and then its node died: the promotion counts, the VM restarts",
		rec:     held("vm-2", 2),
		members: []Member{with(p1, lost), with(s2, lost)},
		want: Plan{Record: &Record{Exists: true, Epoch: 3, Promotions: 1, LastPromoted: "vm-2"}, Promoted: "vm-2", Restart: true,
			Fence: []Fence{{Name: "vm-1", Duplicate: true, Why: "vm-1 is labelled primary but does not hold the pair's record (epoch 3, no holder)"}},
			Drop:  []Drop{{Name: "vm-2", Why: "secondary vm-2 is Lost"}}},
	}, {
		name: "a secondary started beside an earlier primary cannot replace the holder, and is dropped",
		rec:  held("vm-2", 2),
		members: []Member{{Name: "vm-2", Ordinal: 2, Role: Primary, Health: Lost, Epoch: 2},
			{Name: "vm-3", Ordinal: 3, Role: Secondary, Health: Running, Synced: true, Follows: "vm-1"}},
		want: Plan{Record: &Record{Exists: true, Epoch: 3}, Restart: true,
			Fence: []Fence{{Name: "vm-2", Why: "primary vm-2 was lost; no synchronized secondary can take over: the VM restarts from its disks"}},
			Drop:  []Drop{{Name: "vm-3", Why: "secondary vm-3 cannot take over (Running), and its primary was lost: the VM restarts from its disks"}}},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Decide(tc.rec, tc.members)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Decide:\n got %+v\nwant %+v", show(got), show(tc.want))
			}
		})
	}
}

type shown struct {
	Plan
	Rec Record
}

func show(p Plan) shown {
	s := shown{Plan: p}
	if p.Record != nil {
		s.Rec = *p.Record
	}
	s.Record = nil
	return s
}

func TestPromoteCountsOnce(t *testing.T) {
	rec := Record{Exists: true, Holder: "vm-1", Epoch: 3, Promotions: 1, LastPromoted: "vm-0"}
	next, counted := rec.Promote("vm-2")
	if !counted || next.Holder != "vm-2" || next.Epoch != 4 || next.Promotions != 2 || next.LastPromoted != "vm-2" {
		t.Fatalf("Promote = %+v, %v", next, counted)
	}
	again, counted := next.Promote("vm-2")
	if counted || again.Promotions != 2 || again.Epoch != 5 {
		t.Fatalf("a retried promotion of the same member counted again: %+v, %v", again, counted)
	}
}
