// Package roles decides which member of a fault tolerant pair runs the VM. It is the operator's
// go-live decision, pure and table-tested: the controller feeds it the pair's record and what it
// sees of the members, and carries out the plan it returns, record first.
//
// The record (the pair's Lease, shared with lockstepd) names the one member that may run the VM,
// the holder, and the epoch at which it became so. Whoever changes the holder (lockstepd's
// secondary when it goes live, or the operator when it promotes) does so by compare-and-set, so
// one decision wins and a restarted decider reads it back. Everything else follows from the
// record: a holder still labelled secondary is labelled primary; any other member labelled
// primary is fenced; a lost holder is replaced by a synchronized secondary, or, with none, the VM
// restarts from its disks. The record also counts the promotions, keyed by the promoted member's
// name, so that a retry never counts one twice and a crash never loses one.
package roles

import (
	"fmt"
	"sort"
)

// Role labels of members.
const (
	Primary   = "primary"
	Secondary = "secondary"
	// Fenced marks a member that must never run the VM again; it is being deleted.
	Fenced = "fenced"
)

// Health is what Kubernetes shows of a member.
type Health int

const (
	// Pending: not running yet.
	Pending Health = iota
	// Running on a healthy node.
	Running
	// Suspect: its node is not Ready, for less than the grace period.
	Suspect
	// Lost: its node or VMI is gone, or lockstepd fenced it.
	Lost
)

func (h Health) String() string {
	return [...]string{"Pending", "Running", "Suspect", "Lost"}[h]
}

// Member is one member VMI of the pair, not being deleted.
type Member struct {
	Name    string
	Ordinal int
	// Role is its role label: Primary, Secondary or Fenced.
	Role   string
	Health Health
	// Synced: a secondary that holds the primary's state, so that it may be promoted.
	Synced bool
	// Epoch is the record's epoch at which the member became primary (0: unknown).
	Epoch int64
	// Follows, on a secondary, is the primary it was started beside ("" for members of older
	// versions: taken to follow the pair's primary). Only the holder's own secondary may replace it.
	Follows string
}

// follows says whether secondary s may take over from (or stay beside) primary name.
func (s *Member) follows(name string) bool { return s.Follows == name || s.Follows == "" }

// Record is the pair's record.
type Record struct {
	// Exists is false before the first member is created (and for pairs of older versions).
	Exists bool
	// Holder is the name of the member that may run the VM; "" when none may.
	Holder string
	// Epoch grows by one with every change of holder.
	Epoch int64
	// Promotions counts the secondaries that took over; LastPromoted is the last one counted.
	Promotions   int32
	LastPromoted string
	// Operation is the last one-time operation (a test failover) whose role change the record
	// carries; ReservedNode is the node kept for the secondary of a pair whose protection is
	// suspended. Decide carries both over unchanged.
	Operation    string
	ReservedNode string
	// LastOrdinal is the highest member ordinal handed out; a new member takes a higher one, so
	// that a name (the key of LastPromoted and Holder) never names two members. Decide carries
	// it over unchanged.
	LastOrdinal int
}

// Fence is a member to fence: labelled Fenced, then deleted.
type Fence struct {
	Name string
	// Duplicate: it claimed primary without holding the record (otherwise the record moved on
	// because it was lost).
	Duplicate bool
	Why       string
}

// Drop is a secondary to delete: it cannot protect the VM.
type Drop struct {
	Name, Why string
}

// Plan is what to do, in this order: write Record (compare-and-set, before anything else), label
// Relabel primary, fence, drop, and start a new pair when Restart.
type Plan struct {
	// Record is the record to write; nil keeps it.
	Record *Record
	// Promoted is the member whose promotion Record counts ("" when it counts none).
	Promoted string
	// Relabel is the holder, still labelled secondary, to label primary.
	Relabel string
	Fence   []Fence
	Drop    []Drop
	// Primary and Secondary are the members in those roles once the plan is carried out.
	Primary, Secondary string
	// Restart: no member can run the VM; a new pair starts from the VM's disks, and the new
	// primary takes the record when it is created.
	Restart bool
	// Waiting: the primary is lost and the only secondary that could take over is suspect; the
	// decision waits until it is Running or Lost.
	Waiting bool
}

// Decide returns the plan for a pair with record rec and members (none being deleted). A holder
// that is not among members must be known to be gone (not merely absent from a stale cache).
func Decide(rec Record, members []Member) Plan {
	var p Plan
	if !rec.Exists {
		rec = initial(rec, members)
		if len(members) > 0 {
			p.Record = &rec
		}
	}
	byName := map[string]*Member{}
	for i := range members {
		byName[members[i].Name] = &members[i]
	}
	holder := byName[rec.Holder]

	next := p.decideHolder(rec, holder, members)
	if next != rec {
		p.Record = &next
	}

	p.fenceOthers(rec, next, members)
	p.chooseSecondary(members)
	return p
}

// decideHolder decides who holds the record next, and whether the VM waits or restarts.
func (p *Plan) decideHolder(rec Record, holder *Member, members []Member) Record {
	next := rec
	if holder != nil && holder.Role == Secondary {
		// The holder took over: lockstepd's claim, or a promotion whose relabel did not happen yet.
		p.count(&next, holder)
	}
	switch {
	case holder != nil && holder.Role != Fenced && holder.Health != Lost:
		p.Primary = holder.Name
		if holder.Role == Secondary {
			p.Relabel = holder.Name
		}
	default:
		// The holder is lost or gone, or nobody holds the record.
		// Only a secondary started beside the holder holds its state; one beside an earlier primary
		// does not (when the holder is a secondary that took over, no secondary follows it yet).
		successor := func(m *Member) bool {
			return m.Role == Secondary && m.Synced && m.Name != rec.Holder && m.follows(rec.Holder) &&
				(holder == nil || holder.Role == Primary)
		}
		if s := best(members, func(m *Member) bool { return successor(m) && m.Health == Running }); s != nil {
			var counted bool
			next, counted = rec.Promote(s.Name)
			p.Primary, p.Relabel = s.Name, s.Name
			if counted {
				p.Promoted = s.Name
			}
		} else if s := best(members, func(m *Member) bool { return successor(m) && m.Health == Suspect }); s != nil {
			// Promoting loses nothing, restarting loses the VM's memory: wait for the verdict.
			p.Secondary, p.Waiting = s.Name, true
			if holder != nil && holder.Role == Primary {
				p.Primary = holder.Name
			}
		} else {
			if rec.Holder != "" {
				next.Holder, next.Epoch = "", rec.Epoch+1 // the lost holder may never run the VM again
			}
			p.Restart = true
		}
	}
	return next
}

// fenceOthers fences everyone else labelled primary, or left labelled fenced.
func (p *Plan) fenceOthers(rec, next Record, members []Member) {
	for i := range members {
		m := &members[i]
		switch {
		case m.Name == p.Primary:
		case m.Name == p.Secondary && p.Waiting:
		case m.Role == Primary && m.Name == rec.Holder:
			p.Fence = append(p.Fence, Fence{Name: m.Name,
				Why: fmt.Sprintf("primary %s was lost; %s", m.Name, successor(*p, next))})
		case m.Role == Primary && p.Relabel != "":
			// The record moved to a secondary (lockstepd's claim): this was the primary it replaced.
			p.Fence = append(p.Fence, Fence{Name: m.Name,
				Why: fmt.Sprintf("primary %s was superseded; %s", m.Name, successor(*p, next))})
		case m.Role == Primary:
			p.Fence = append(p.Fence, Fence{Name: m.Name, Duplicate: true,
				Why: fmt.Sprintf("%s is labelled primary but does not hold the pair's record (epoch %d, %s)", m.Name, next.Epoch, holderName(next))})
		case m.Role == Fenced:
			p.Fence = append(p.Fence, Fence{Name: m.Name, Why: fmt.Sprintf("%s was fenced", m.Name)})
		}
	}
}

// count counts the promotion of s in the record, once.
func (p *Plan) count(next *Record, s *Member) {
	if next.countPromotion(s.Name) {
		p.Promoted = s.Name
	}
}

// Promote is rec with member holding it at the next epoch and the promotion counted once: the
// record of a secondary that takes over (on the primary's loss, or in a test failover). It says
// whether it counted the promotion.
func (rec Record) Promote(member string) (Record, bool) {
	next := rec
	next.Holder, next.Epoch = member, rec.Epoch+1
	counted := next.countPromotion(member)
	return next, counted
}

// countPromotion counts a promotion of member once: the promoted member's name is the key, so
// that a retried count does not count twice. It says whether it counted.
func (rec *Record) countPromotion(member string) bool {
	if rec.LastPromoted == member {
		return false
	}
	rec.Promotions++
	rec.LastPromoted = member
	return true
}

// chooseSecondary keeps one secondary beside a primary that can feed it; the others are dropped.
func (p *Plan) chooseSecondary(members []Member) {
	if p.Waiting {
		return
	}
	keep := ""
	if p.Primary != "" && p.Relabel == "" {
		// Only a primary that already ran as primary has a secondary following it: one promoted
		// now leaves the old primary's secondaries behind.
		if s := best(members, func(m *Member) bool { return m.Role == Secondary && m.Health != Lost && m.follows(p.Primary) }); s != nil {
			keep = s.Name
		}
	}
	p.Secondary = keep
	for i := range members {
		m := &members[i]
		if m.Role != Secondary || m.Name == keep || m.Name == p.Primary {
			continue
		}
		why := fmt.Sprintf("secondary %s is %s", m.Name, m.Health)
		switch {
		case m.Health == Lost:
		case p.Restart && !m.Synced:
			why = fmt.Sprintf("secondary %s never synchronized, and its primary was lost: the VM restarts from its disks", m.Name)
		case p.Restart:
			why = fmt.Sprintf("secondary %s cannot take over (%s), and its primary was lost: the VM restarts from its disks", m.Name, m.Health)
		case p.Relabel != "" || !m.follows(p.Primary):
			why = fmt.Sprintf("secondary %s followed an earlier primary; %s takes a new one", m.Name, p.Primary)
		default:
			why = fmt.Sprintf("secondary %s is surplus: %s is the pair's secondary", m.Name, keep)
		}
		p.Drop = append(p.Drop, Drop{Name: m.Name, Why: why})
	}
}

// initial is the record of a pair that has none: the member labelled primary with the newest
// epoch (then one that is not lost, then the oldest) holds it, at an epoch above any a member knew.
func initial(rec Record, members []Member) Record {
	rec.Exists = true
	if len(members) == 0 {
		return rec // the first primary takes epoch 1 when it is created
	}
	var top int64
	for _, m := range members {
		top = max(top, m.Epoch)
	}
	rec.Epoch = top + 1
	cands := make([]Member, 0, len(members))
	for _, m := range members {
		if m.Role == Primary {
			cands = append(cands, m)
		}
	}
	sort.Slice(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if a.Epoch != b.Epoch {
			return a.Epoch > b.Epoch
		}
		if (a.Health == Lost) != (b.Health == Lost) {
			return b.Health == Lost
		}
		return a.Ordinal < b.Ordinal
	})
	if len(cands) > 0 {
		rec.Holder = cands[0].Name
	}
	return rec
}

// best is the member that ok accepts with the lowest ordinal, or nil.
func best(members []Member, ok func(*Member) bool) *Member {
	var b *Member
	for i := range members {
		m := &members[i]
		if ok(m) && (b == nil || m.Ordinal < b.Ordinal) {
			b = m
		}
	}
	return b
}

func successor(p Plan, next Record) string {
	switch {
	case p.Primary != "":
		return fmt.Sprintf("%s runs the VM from epoch %d", p.Primary, next.Epoch)
	case p.Restart:
		return "no synchronized secondary can take over: the VM restarts from its disks"
	}
	return "it may not run the VM"
}

func holderName(r Record) string {
	if r.Holder == "" {
		return "no holder"
	}
	return "held by " + r.Holder
}
