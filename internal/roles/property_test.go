package roles

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// apply carries out the first steps of a plan (0: none; 1: the record; 2: and the relabel; 3: and
// the fences and drops), as a decider that crashes after a step would leave the pair.
func apply(rec Record, members []Member, p Plan, steps int) (Record, []Member) {
	out := append([]Member(nil), members...)
	if steps >= 1 && p.Record != nil {
		rec = *p.Record
	}
	if steps >= 2 {
		for i := range out {
			for _, f := range p.Fence {
				if out[i].Name == f.Name {
					out[i].Role = Fenced
				}
			}
			if out[i].Name == p.Relabel {
				out[i].Role, out[i].Epoch = Primary, rec.Epoch
			}
		}
	}
	if steps >= 3 {
		gone := map[string]bool{}
		for _, f := range p.Fence {
			gone[f.Name] = true
		}
		for _, d := range p.Drop {
			gone[d.Name] = true
		}
		kept := out[:0]
		for _, m := range out {
			if !gone[m.Name] {
				kept = append(kept, m)
			}
		}
		out = kept
	}
	return rec, out
}

func randomPair(r *rand.Rand) (Record, []Member) {
	roles := []string{Primary, Secondary, Fenced}
	var members []Member
	for i := range r.IntN(4) {
		members = append(members, Member{
			Name: fmt.Sprintf("vm-%d", i+1), Ordinal: i + 1,
			Role: roles[r.IntN(3)], Health: Health(r.IntN(4)), Synced: r.IntN(2) == 0, Epoch: int64(r.IntN(3)),
		})
		if i > 0 && r.IntN(3) > 0 {
			members[i].Follows = members[r.IntN(i)].Name
		}
	}
	rec := Record{Exists: r.IntN(5) > 0, Epoch: int64(r.IntN(4)), Promotions: int32(r.IntN(3)), LastOrdinal: len(members) + r.IntN(3)}
	if len(members) > 0 && r.IntN(4) > 0 {
		rec.Holder = members[r.IntN(len(members))].Name
	}
	if !rec.Exists {
		rec = Record{Promotions: rec.Promotions, LastOrdinal: rec.LastOrdinal}
	}
	if rec.Holder != "" && r.IntN(2) == 0 {
		rec.LastPromoted = rec.Holder
	}
	return rec, members
}

func labelledPrimary(members []Member) int {
	n := 0
	for _, m := range members {
		if m.Role == Primary {
			n++
		}
	}
	return n
}

// TestDecideProperties: whatever the pair looks like, and wherever the decider crashes while it
// carries out a plan, deciding again converges in one more round, counts each promotion once,
// never labels two members primary, never moves the record backwards, and keeps the names
// handed out.
func TestDecideProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		rec, members := randomPair(r)
		start := rec
		p := Decide(rec, members)
		if p.Record != nil && p.Record.Epoch < rec.Epoch {
			t.Fatalf("case %d: the record went back from epoch %d to %d", i, rec.Epoch, p.Record.Epoch)
		}
		if p.Record != nil && p.Record.Promotions > rec.Promotions+1 {
			t.Fatalf("case %d: %d promotions counted at once", i, p.Record.Promotions-rec.Promotions)
		}
		if p.Record != nil && p.Record.LastOrdinal != rec.LastOrdinal {
			t.Fatalf("case %d: the record's last ordinal went from %d to %d: names would be used again", i, rec.LastOrdinal, p.Record.LastOrdinal)
		}
		if (p.Promoted != "") != (p.Record != nil && p.Record.Promotions == rec.Promotions+1) {
			t.Fatalf("case %d: Promoted %q does not match the count", i, p.Promoted)
		}
		holder := rec.Holder
		if !rec.Exists {
			holder = initial(rec, members).Holder
		}
		if p.Promoted != "" && p.Promoted != holder {
			for _, m := range members {
				if m.Name == p.Promoted && !m.follows(holder) {
					t.Fatalf("case %d: promoted %s, which follows %s, not the holder %s", i, m.Name, m.Follows, holder)
				}
			}
		}
		crash := r.IntN(4)
		rec, members = apply(rec, members, p, crash)
		if crash >= 2 && labelledPrimary(members) > 1 {
			t.Fatalf("case %d: %d members labelled primary after the relabel", i, labelledPrimary(members))
		}
		// Carry out the next plans in full until nothing is left to do.
		for round := 0; ; round++ {
			if round > 3 {
				t.Fatalf("case %d: no fixpoint after %d rounds: %+v %+v", i, round, rec, members)
			}
			q := Decide(rec, members)
			if q.Record == nil && q.Relabel == "" && len(q.Fence) == 0 && len(q.Drop) == 0 {
				if labelledPrimary(members) > 1 {
					t.Fatalf("case %d: settled with %d members labelled primary: %+v", i, labelledPrimary(members), members)
				}
				break
			}
			rec, members = apply(rec, members, q, 3)
		}
		if rec.Promotions > start.Promotions+2 {
			t.Fatalf("case %d: %d promotions counted for one failure", i, rec.Promotions-start.Promotions)
		}
	}
}
