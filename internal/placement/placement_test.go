package placement

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

var defaultLimits = Limits{MaxMembers: 4, MaxVCPUs: 8, LogBandwidthMbps: 1000}

func TestPlaceNeverPutsBothMembersOnOneNode(t *testing.T) {
	nodes := []Node{{Name: "a", Limits: defaultLimits}, {Name: "b", Limits: defaultLimits}}
	p, err := Place(nodes, Request{Pair: "x", Role: Primary, VCPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	nodes = addMember(nodes, p, Member{Pair: "x", Role: Primary, VCPUs: 1})
	s, err := Place(nodes, Request{Pair: "x", Role: Secondary, VCPUs: 1, AvoidNodes: []string{p}})
	if err != nil {
		t.Fatal(err)
	}
	if s == p {
		t.Fatalf("both members on %s", p)
	}
	nodes = addMember(nodes, s, Member{Pair: "x", Role: Secondary, VCPUs: 1})
	// A third member of the same pair has nowhere to go.
	_, err = Place(nodes, Request{Pair: "x", Role: Secondary, VCPUs: 1})
	var nee *NoEligibleNodeError
	if !errors.As(err, &nee) || !errors.Is(err, ErrNoEligibleNode) {
		t.Fatalf("want NoEligibleNodeError, got %v", err)
	}
	if nee.Rejected["a"] != RejectSamePair || nee.Rejected["b"] != RejectSamePair {
		t.Fatalf("reasons: %v", nee.Rejected)
	}
}

func TestPlaceRejectionsSayWhy(t *testing.T) {
	full := Node{Name: "full", Limits: defaultLimits}
	for i := range 4 {
		full.Members = append(full.Members, Member{Pair: fmt.Sprint("p", i), Role: Primary, VCPUs: 1})
	}
	cpu := Node{Name: "cpu", Limits: defaultLimits, Members: []Member{{Pair: "big", Role: Primary, VCPUs: 7}}}
	bw := Node{Name: "bw", Limits: defaultLimits, Members: []Member{{Pair: "loud", Role: Secondary, VCPUs: 1, LogBandwidthMbps: 950}}}
	down := Node{Name: "down", Unavailable: "NotReady", Limits: defaultLimits}
	zone := Node{Name: "zone", Domain: "z1", Limits: defaultLimits}
	nodes := []Node{full, cpu, bw, down, zone}
	_, err := Place(nodes, Request{Pair: "x", Role: Secondary, VCPUs: 2, LogBandwidthMbps: 100, AvoidDomains: []string{"z1"}})
	var nee *NoEligibleNodeError
	if !errors.As(err, &nee) {
		t.Fatalf("want NoEligibleNodeError, got %v", err)
	}
	want := map[string]string{
		// full has no domain, and the domain check comes first.
		"full": RejectNoTopologyInfo, "cpu": RejectNoTopologyInfo, "bw": RejectNoTopologyInfo,
		"down": "NotReady", "zone": RejectSameDomain,
	}
	for n, r := range want {
		if nee.Rejected[n] != r {
			t.Errorf("%s: got %q, want %q", n, nee.Rejected[n], r)
		}
	}
	// Without the topology constraint each capacity reason shows.
	_, err = Place(nodes, Request{Pair: "x", Role: Secondary, VCPUs: 2, LogBandwidthMbps: 100, AvoidNodes: []string{"zone"}})
	if !errors.As(err, &nee) {
		t.Fatalf("want NoEligibleNodeError, got %v", err)
	}
	want = map[string]string{"full": RejectMemberLimit, "cpu": RejectVCPULimit, "bw": RejectLogBandwidth, "down": "NotReady", "zone": RejectAntiAffinity}
	for n, r := range want {
		if nee.Rejected[n] != r {
			t.Errorf("%s: got %q, want %q", n, nee.Rejected[n], r)
		}
	}
	if got := err.Error(); got != "0/5 nodes are eligible: 1 FT VM limit reached, 1 FT vCPU limit reached, 1 NotReady, 1 holds the other member of the pair, 1 logging bandwidth budget exhausted" {
		t.Errorf("message: %s", got)
	}
}

func TestPlaceBalancesLoggingTrafficByDirection(t *testing.T) {
	// Paper 2.7: spread primaries so that logging traffic is balanced. Placing pairs one after
	// another on three nodes ends with one primary and one secondary on each node.
	nodes := []Node{{Name: "a", Limits: defaultLimits}, {Name: "b", Limits: defaultLimits}, {Name: "c", Limits: defaultLimits}}
	for i := range 3 {
		pair := fmt.Sprint("vm", i)
		p, err := Place(nodes, Request{Pair: pair, Role: Primary, VCPUs: 1, LogBandwidthMbps: 100})
		if err != nil {
			t.Fatal(err)
		}
		nodes = addMember(nodes, p, Member{Pair: pair, Role: Primary, VCPUs: 1, LogBandwidthMbps: 100})
		s, err := Place(nodes, Request{Pair: pair, Role: Secondary, VCPUs: 1, LogBandwidthMbps: 100, AvoidNodes: []string{p}})
		if err != nil {
			t.Fatal(err)
		}
		nodes = addMember(nodes, s, Member{Pair: pair, Role: Secondary, VCPUs: 1, LogBandwidthMbps: 100})
	}
	for _, n := range nodes {
		u := UsageOf(n)
		if u.Primaries != 1 || u.Members != 2 {
			t.Errorf("node %s holds %d primaries of %d members; want 1 of 2", n.Name, u.Primaries, u.Members)
		}
	}
}

func TestPlacePairStartsWholePairsBeforeLonePrimaries(t *testing.T) {
	lim := Limits{MaxMembers: 2, MaxVCPUs: 8}
	nodes := []Node{{Name: "a", Limits: lim}, {Name: "b", Limits: lim}, {Name: "c", Limits: lim}}
	// Three nodes with two slots each hold three pairs, each on two different nodes.
	for i := range 3 {
		pair := fmt.Sprint("p", i)
		pp, err := PlacePair(nodes, Request{Pair: pair, Role: Primary, VCPUs: 1}, Request{Pair: pair, Role: Secondary, VCPUs: 1}, false)
		if err != nil || pp.Secondary == "" || pp.Primary == pp.Secondary {
			t.Fatalf("pair %d: %+v, %v", i, pp, err)
		}
		nodes = addMember(nodes, pp.Primary, Member{Pair: pair, Role: Primary, VCPUs: 1})
		nodes = addMember(nodes, pp.Secondary, Member{Pair: pair, Role: Secondary, VCPUs: 1})
	}
	_, err := PlacePair(nodes, Request{Pair: "p3", Role: Primary, VCPUs: 1}, Request{Pair: "p3", Role: Secondary, VCPUs: 1}, false)
	if !errors.Is(err, ErrNoEligibleNode) {
		t.Fatalf("full cluster: want ErrNoEligibleNode, got %v", err)
	}

	// One node with room: the primary starts alone, and the placement says why it is alone.
	nodes = append(nodes, Node{Name: "d", Limits: lim})
	pp, err := PlacePair(nodes, Request{Pair: "p3", Role: Primary, VCPUs: 1}, Request{Pair: "p3", Role: Secondary, VCPUs: 1}, false)
	if err != nil || pp.Primary != "d" || pp.Secondary != "" {
		t.Fatalf("want a lone primary on d, got %+v, %v", pp, err)
	}
	var nee *NoEligibleNodeError
	if !errors.As(pp.SecondaryErr, &nee) || nee.Rejected["d"] != RejectAntiAffinity || nee.Rejected["a"] != RejectMemberLimit {
		t.Fatalf("secondary's reasons: %v", pp.SecondaryErr)
	}

	// With a topology key the secondary leaves the primary's domain.
	zoned := []Node{{Name: "a", Domain: "z1", Limits: lim}, {Name: "b", Domain: "z1", Limits: lim}, {Name: "c", Domain: "z2", Limits: Limits{MaxMembers: 4, MaxVCPUs: 8}}}
	zoned = addMember(zoned, "c", Member{Pair: "other", Role: Secondary, VCPUs: 1})
	pp, err = PlacePair(zoned, Request{Pair: "z", Role: Primary, VCPUs: 1}, Request{Pair: "z", Role: Secondary, VCPUs: 1}, true)
	if err != nil || pp.Primary != "a" || pp.Secondary != "c" {
		t.Fatalf("zoned: want a and c, got %+v, %v", pp, err)
	}
}

func TestPlacePairLeavesTheSlotOfAWaitingSecondary(t *testing.T) {
	lim := Limits{MaxMembers: 2, MaxVCPUs: 8}
	// "run" runs a lone primary on a; b has the only free slots.
	nodes := []Node{{Name: "a", Limits: lim}, {Name: "b", Limits: lim}}
	nodes = addMember(nodes, "a", Member{Pair: "run", Role: Primary, VCPUs: 1})
	nodes = addMember(nodes, "a", Member{Pair: "full", Role: Primary, VCPUs: 1})
	pp, err := PlacePair(nodes, Request{Pair: "new", Role: Primary, VCPUs: 1}, Request{Pair: "new", Role: Secondary, VCPUs: 1}, false)
	// One slot on b is held for run's secondary (and one for full's); "new" must wait.
	if err == nil {
		t.Fatalf("a new pair took a slot that protects a running VM: %+v", pp)
	}
	// The waiting secondaries themselves still go there.
	if n, err := Place(nodes, Request{Pair: "run", Role: Secondary, VCPUs: 1, AvoidNodes: []string{"a"}}); err != nil || n != "b" {
		t.Fatalf("run's secondary: %s, %v", n, err)
	}
	if got := HoldWaitingSecondaries(nodes); len(got[1].Members) != 2 || len(nodes[1].Members) != 0 {
		t.Fatalf("held %v; the input must stay as it was: %v", got[1].Members, nodes[1].Members)
	}
}

func TestLogBandwidthFormula(t *testing.T) {
	// Paper 2.10: (disk reads MB/s * 8 + network receives Mbit/s) * 1.2.
	for _, c := range []struct{ disk, net, want int }{{0, 0, 0}, {10, 20, 120}, {0, 1, 2}, {100, 150, 1140}} {
		if got := LogBandwidthMbps(c.disk, c.net); got != c.want {
			t.Errorf("LogBandwidthMbps(%d, %d) = %d, want %d", c.disk, c.net, got, c.want)
		}
	}
}

func TestCOLOLogBandwidthFormula(t *testing.T) {
	// ((dirtied memory + disk writes) MB/s * 8 + receives + transmits Mbit/s) * 1.2, rounded up.
	for _, c := range []struct{ dirty, write, recv, xmit, want int }{
		{0, 0, 0, 0, 0},
		{10, 0, 0, 0, 96},       // a build: its dirtied memory alone
		{0, 5, 20, 0, 72},       // (5*8 + 20) * 1.2
		{1, 1, 1, 0, 21},        // 17 * 1.2 = 20.4, rounded up
		{0, 0, 100, 900, 1200},  // what it sends comes back to be compared
		{10, 10, 100, 100, 432}, // (160 + 200) * 1.2
	} {
		if got := COLOLogBandwidthMbps(c.dirty, c.write, c.recv, c.xmit); got != c.want {
			t.Errorf("COLOLogBandwidthMbps(%d, %d, %d, %d) = %d, want %d", c.dirty, c.write, c.recv, c.xmit, got, c.want)
		}
	}
}

// TestPlacementPropertiesUnderChurn drives random clusters through pair creation, deletion, node
// loss with promotion and re-protection, and node addition, and checks after every step that
//   - no node holds more FT members, vCPUs or logging bandwidth than its limits allow, even
//     after promotions turned secondaries into primaries,
//   - no pair has both members on one node, or in one topology domain when it asked for that,
//   - Place fails only when an independent check finds no eligible node, and its choice is
//     eligible.
func TestPlacementPropertiesUnderChurn(t *testing.T) {
	for seed := range uint64(300) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			runChurn(t, rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)))
		})
	}
}

type simPair struct {
	vcpus, bw int
	zoned     bool
	primary   string // node, "" when none
	secondary string
}

type sim struct {
	t     *testing.T
	r     *rand.Rand
	nodes []Node
	pairs map[string]*simPair
	next  int
}

func runChurn(t *testing.T, r *rand.Rand) {
	s := &sim{t: t, r: r, pairs: map[string]*simPair{}}
	for range 2 + r.IntN(7) {
		s.addNode()
	}
	for step := range 200 {
		switch op := r.IntN(10); {
		case op < 5:
			s.addPair()
		case op < 7:
			s.deletePair()
		case op < 9:
			s.loseNode()
		default:
			s.addNode()
		}
		s.reprotectAll()
		s.checkInvariants(step)
	}
}

func (s *sim) addNode() {
	lim := Limits{MaxMembers: 1 + s.r.IntN(6), MaxVCPUs: 1 + s.r.IntN(12)}
	if s.r.IntN(2) == 0 {
		lim.LogBandwidthMbps = 100 + s.r.IntN(1000)
	}
	n := Node{Name: fmt.Sprintf("node-%03d", s.next), Domain: fmt.Sprint("zone-", s.r.IntN(3)), Limits: lim}
	if s.r.IntN(8) == 0 {
		n.Unavailable = "NotReady"
	}
	s.next++
	s.nodes = append(s.nodes, n)
}

func (s *sim) nodeIndex(name string) int {
	for i := range s.nodes {
		if s.nodes[i].Name == name {
			return i
		}
	}
	s.t.Fatalf("no node %s", name)
	return -1
}

func (s *sim) request(name string, p *simPair, role Role, other string) Request {
	req := Request{Pair: name, Role: role, VCPUs: p.vcpus, LogBandwidthMbps: p.bw}
	if other != "" {
		req.AvoidNodes = []string{other}
		if p.zoned {
			req.AvoidDomains = []string{s.nodes[s.nodeIndex(other)].Domain}
		}
	}
	return req
}

// place asks Place and checks its answer against the oracle.
func (s *sim) place(req Request) string {
	got, err := Place(s.nodes, req)
	anyEligible := false
	for _, n := range s.nodes {
		if oracleFits(n, req) {
			anyEligible = true
		}
	}
	if err != nil {
		if !errors.Is(err, ErrNoEligibleNode) {
			s.t.Fatalf("unexpected error %v", err)
		}
		if anyEligible {
			s.t.Fatalf("Place found no node for %+v, but one is eligible: %v", req, err)
		}
		return ""
	}
	if !oracleFits(s.nodes[s.nodeIndex(got)], req) {
		s.t.Fatalf("Place chose %s for %+v, which is not eligible", got, req)
	}
	return got
}

func (s *sim) addPair() {
	name := fmt.Sprint("pair-", s.next)
	s.next++
	p := &simPair{vcpus: 1 + s.r.IntN(4), zoned: s.r.IntN(3) == 0}
	if s.r.IntN(2) == 0 {
		p.bw = s.r.IntN(400)
	}
	s.pairs[name] = p
	pp, err := PlacePair(s.nodes, s.request(name, p, Primary, ""), s.request(name, p, Secondary, ""), p.zoned)
	// The oracle sees what PlacePair may use: the nodes less the slots held for waiting secondaries.
	held := HoldWaitingSecondaries(s.nodes)
	both := s.oraclePairExists(held, name, p)
	if err != nil {
		if !errors.Is(err, ErrNoEligibleNode) {
			s.t.Fatalf("unexpected error %v", err)
		}
		for _, n := range held {
			if oracleFits(n, s.request(name, p, Primary, "")) {
				s.t.Fatalf("PlacePair found no node for %s's primary, but %s is eligible: %v", name, n.Name, err)
			}
		}
		return
	}
	if !oracleFits(held[s.nodeIndex(pp.Primary)], s.request(name, p, Primary, "")) {
		s.t.Fatalf("PlacePair put %s's primary on %s, which is not eligible or holds a waiting secondary's slot", name, pp.Primary)
	}
	p.primary = pp.Primary
	s.nodes = addMember(s.nodes, pp.Primary, Member{Pair: name, Role: Primary, VCPUs: p.vcpus, LogBandwidthMbps: p.bw})
	if pp.Secondary == "" {
		if both {
			s.t.Fatalf("PlacePair started %s's primary alone (%v), but two nodes can take the pair", name, pp.SecondaryErr)
		}
		if !errors.Is(pp.SecondaryErr, ErrNoEligibleNode) {
			s.t.Fatalf("a lone primary must say why: %v", pp.SecondaryErr)
		}
		return
	}
	if !oracleFits(s.nodes[s.nodeIndex(pp.Secondary)], s.request(name, p, Secondary, pp.Primary)) {
		s.t.Fatalf("PlacePair put %s's secondary on %s next to its primary on %s, which is not eligible", name, pp.Secondary, pp.Primary)
	}
	p.secondary = pp.Secondary
	s.nodes = addMember(s.nodes, pp.Secondary, Member{Pair: name, Role: Secondary, VCPUs: p.vcpus, LogBandwidthMbps: p.bw})
}

// oraclePairExists says, by trying every two nodes, whether the new pair fits as a whole.
func (s *sim) oraclePairExists(nodes []Node, name string, p *simPair) bool {
	for _, a := range nodes {
		if !oracleFits(a, s.request(name, p, Primary, "")) {
			continue
		}
		with := make([]Node, len(nodes))
		for i := range nodes {
			with[i] = nodes[i]
			with[i].Members = append([]Member{}, nodes[i].Members...)
		}
		with = addMember(with, a.Name, Member{Pair: name, Role: Primary, VCPUs: p.vcpus, LogBandwidthMbps: p.bw})
		for _, b := range with {
			if oracleFits(b, s.request(name, p, Secondary, a.Name)) {
				return true
			}
		}
	}
	return false
}

func (s *sim) deletePair() {
	for name := range s.pairs { // random enough: map order
		s.removePairFrom(name, s.pairs[name].primary)
		s.removePairFrom(name, s.pairs[name].secondary)
		delete(s.pairs, name)
		return
	}
}

func (s *sim) removePairFrom(pair, node string) {
	if node == "" {
		return
	}
	i := s.nodeIndex(node)
	kept := s.nodes[i].Members[:0]
	for _, m := range s.nodes[i].Members {
		if m.Pair != pair {
			kept = append(kept, m)
		}
	}
	s.nodes[i].Members = kept
}

// loseNode removes a node; a pair that lost its primary promotes its secondary.
func (s *sim) loseNode() {
	if len(s.nodes) == 0 {
		return
	}
	i := s.r.IntN(len(s.nodes))
	lost := s.nodes[i].Name
	s.nodes = append(s.nodes[:i], s.nodes[i+1:]...)
	for name, p := range s.pairs {
		if p.primary == lost {
			p.primary, p.secondary = p.secondary, ""
			if p.primary != "" {
				j := s.nodeIndex(p.primary)
				for k := range s.nodes[j].Members {
					if s.nodes[j].Members[k].Pair == name {
						s.nodes[j].Members[k].Role = Primary
					}
				}
			}
		}
		if p.secondary == lost {
			p.secondary = ""
		}
	}
}

// reprotectAll gives every pair without a member in a role a new one, where one fits.
func (s *sim) reprotectAll() {
	for name, p := range s.pairs {
		if p.primary == "" {
			if node := s.place(s.request(name, p, Primary, p.secondary)); node != "" {
				p.primary = node
				s.nodes = addMember(s.nodes, node, Member{Pair: name, Role: Primary, VCPUs: p.vcpus, LogBandwidthMbps: p.bw})
			}
		}
		if p.primary != "" && p.secondary == "" {
			if node := s.place(s.request(name, p, Secondary, p.primary)); node != "" {
				p.secondary = node
				s.nodes = addMember(s.nodes, node, Member{Pair: name, Role: Secondary, VCPUs: p.vcpus, LogBandwidthMbps: p.bw})
			}
		}
	}
}

func (s *sim) checkInvariants(step int) {
	for _, n := range s.nodes {
		members, vcpus, send, recv := 0, 0, 0, 0
		pairs := map[string]bool{}
		for _, m := range n.Members {
			members++
			vcpus += m.VCPUs
			if m.Role == Primary {
				send += m.LogBandwidthMbps
			} else {
				recv += m.LogBandwidthMbps
			}
			if pairs[m.Pair] {
				s.t.Fatalf("step %d: node %s holds both members of %s", step, n.Name, m.Pair)
			}
			pairs[m.Pair] = true
		}
		l := n.Limits
		if members > l.MaxMembers || vcpus > l.MaxVCPUs || (l.LogBandwidthMbps > 0 && send+recv > l.LogBandwidthMbps) {
			s.t.Fatalf("step %d: node %s over its limits %+v: %d members, %d vCPUs, %d/%d Mbit/s", step, n.Name, l, members, vcpus, send, recv)
		}
	}
	for name, p := range s.pairs {
		if p.primary != "" && p.primary == p.secondary {
			s.t.Fatalf("step %d: pair %s has both members on %s", step, name, p.primary)
		}
		if p.zoned && p.primary != "" && p.secondary != "" &&
			s.nodes[s.nodeIndex(p.primary)].Domain == s.nodes[s.nodeIndex(p.secondary)].Domain {
			s.t.Fatalf("step %d: zoned pair %s has both members in one domain", step, name)
		}
	}
}

// oracleFits is an independent, plain statement of the placement rules.
func oracleFits(n Node, req Request) bool {
	if n.Unavailable != "" {
		return false
	}
	members, vcpus, bw := 1, req.VCPUs, req.LogBandwidthMbps
	for _, m := range n.Members {
		if m.Pair == req.Pair {
			return false
		}
		members++
		vcpus += m.VCPUs
		bw += m.LogBandwidthMbps
	}
	for _, a := range req.AvoidNodes {
		if a == n.Name {
			return false
		}
	}
	for _, d := range req.AvoidDomains {
		if d == n.Domain || n.Domain == "" {
			return false
		}
	}
	return members <= n.Limits.MaxMembers && vcpus <= n.Limits.MaxVCPUs &&
		(n.Limits.LogBandwidthMbps == 0 || bw <= n.Limits.LogBandwidthMbps)
}

func addMember(nodes []Node, name string, m Member) []Node {
	for i := range nodes {
		if nodes[i].Name == name {
			nodes[i].Members = append(nodes[i].Members, m)
		}
	}
	return nodes
}

// A suspended pair's reservation holds its secondary's room against every other pair, and is
// where its own next secondary goes, even when another node is emptier.
func TestReservationHoldsTheSuspendedSecondarysRoom(t *testing.T) {
	one := Limits{MaxMembers: 1, MaxVCPUs: 8}
	nodes := []Node{
		{Name: "a", Limits: defaultLimits, Members: []Member{{Pair: "x", Role: Primary, VCPUs: 2}}},
		{Name: "b", Limits: one, Members: []Member{{Pair: "x", Role: Secondary, VCPUs: 2, Reserved: true}}},
		{Name: "c", Limits: defaultLimits},
	}
	if why := Fits(nodes[1], Request{Pair: "y", Role: Primary, VCPUs: 1}); why != RejectMemberLimit {
		t.Fatalf("another pair on the reserved node: %q, want %q", why, RejectMemberLimit)
	}
	got, err := Place(nodes, Request{Pair: "x", Role: Secondary, VCPUs: 2, AvoidNodes: []string{"a"}})
	if err != nil || got != "b" {
		t.Fatalf("the pair's own secondary: %q, %v; want its reservation b", got, err)
	}
}

func TestPlaceOnTheNodeAskedFor(t *testing.T) {
	nodes := []Node{{Name: "a", Limits: defaultLimits}, {Name: "b", Limits: defaultLimits}, {Name: "c", Limits: defaultLimits}}
	got, err := Place(nodes, Request{Pair: "x", Role: Secondary, VCPUs: 1, Node: "c"})
	if err != nil || got != "c" {
		t.Fatalf("got %q, %v; want c", got, err)
	}
	_, err = Place(nodes, Request{Pair: "x", Role: Secondary, VCPUs: 1, Node: "c", AvoidNodes: []string{"c"}})
	var nee *NoEligibleNodeError
	if !errors.As(err, &nee) || nee.Rejected["a"] != RejectNotAsked || nee.Rejected["c"] != RejectAntiAffinity {
		t.Fatalf("want a rejected as not asked and c as the other member's: %v", err)
	}
}

// A preferred node is taken when it fits, whatever the balance says; when it does not fit, the
// member goes where it would have gone without the preference.
func TestPlaceOnThePreferredNodeWhenItFits(t *testing.T) {
	busy := Node{Name: "a", Limits: defaultLimits, Members: []Member{{Pair: "y", Role: Secondary, VCPUs: 1, LogBandwidthMbps: 100}}}
	nodes := []Node{busy, {Name: "b", Limits: defaultLimits}, {Name: "c", Limits: defaultLimits}}
	if got, err := Place(nodes, Request{Pair: "x", Role: Secondary, VCPUs: 1, PreferNode: "a"}); err != nil || got != "a" {
		t.Fatalf("got %q, %v; want the preferred a", got, err)
	}
	if got, err := Place(nodes, Request{Pair: "x", Role: Secondary, VCPUs: 1}); err != nil || got != "b" {
		t.Fatalf("without a preference: got %q, %v; want b", got, err)
	}
	full := Node{Name: "a", Limits: Limits{MaxMembers: 1, MaxVCPUs: 8}, Members: busy.Members}
	if got, err := Place([]Node{full, nodes[1], nodes[2]}, Request{Pair: "x", Role: Secondary, VCPUs: 1, PreferNode: "a"}); err != nil || got != "b" {
		t.Fatalf("a full preferred node: got %q, %v; want b", got, err)
	}
	if got, err := Place(nodes, Request{Pair: "x", Role: Secondary, VCPUs: 1, PreferNode: "a", AvoidNodes: []string{"a"}}); err != nil || got != "b" {
		t.Fatalf("a preferred node to avoid: got %q, %v; want b", got, err)
	}
}

// A primary whose protection is Disabled holds no slot for a secondary it will not have.
func TestNoSlotHeldForADisabledPairsSecondary(t *testing.T) {
	nodes := []Node{
		{Name: "a", Limits: defaultLimits, Members: []Member{{Pair: "x", Role: Primary, VCPUs: 2, Alone: true}}},
		{Name: "b", Limits: defaultLimits},
	}
	for _, n := range HoldWaitingSecondaries(nodes) {
		if n.Name == "b" && len(n.Members) != 0 {
			t.Fatalf("a slot was held on b for x: %v", n.Members)
		}
	}
	nodes[0].Members[0].Alone = false
	held := false
	for _, n := range HoldWaitingSecondaries(nodes) {
		held = held || n.Name == "b" && len(n.Members) == 1
	}
	if !held {
		t.Fatal("a slot must be held on b for x's secondary when x is not Disabled")
	}
}

// A node that just lost or dropped a member of the pair is avoided, unless a person asked for it.
func TestSuspectNodesAvoidedUnlessAskedFor(t *testing.T) {
	nodes := []Node{{Name: "a", Limits: defaultLimits}, {Name: "b", Limits: defaultLimits}}
	_, err := Place(nodes, Request{Pair: "x", Role: Secondary, VCPUs: 1, AvoidNodes: []string{"a"}, SuspectNodes: []string{"b"}})
	var nee *NoEligibleNodeError
	if !errors.As(err, &nee) || nee.Rejected["b"] != RejectSuspect {
		t.Fatalf("want b rejected as suspect: %v", err)
	}
	got, err := Place(nodes, Request{Pair: "x", Role: Secondary, VCPUs: 1, AvoidNodes: []string{"a"}, SuspectNodes: []string{"b"}, Node: "b"})
	if err != nil || got != "b" {
		t.Fatalf("the node asked for: %q, %v", got, err)
	}
}

func TestPlaceCountsAllocatableResources(t *testing.T) {
	const gi = int64(1) << 30
	alloc := Resources{MilliCPU: 8000, MemoryBytes: 32 * gi}
	member := Resources{MilliCPU: 2000, MemoryBytes: 4 * gi}
	cases := []struct {
		name string
		node Node
		want string
	}{
		{"room", Node{Name: "n", Limits: defaultLimits, Allocatable: alloc, Requested: Resources{MilliCPU: 6000, MemoryBytes: 28 * gi}}, ""},
		{"other pods take the CPU", Node{Name: "n", Limits: defaultLimits, Allocatable: alloc, Requested: Resources{MilliCPU: 6001}}, RejectInsufficientCPU},
		{"other pods take the memory", Node{Name: "n", Limits: defaultLimits, Allocatable: alloc, Requested: Resources{MemoryBytes: 28*gi + 1}}, RejectInsufficientMemory},
		{"a member not bound yet counts", Node{Name: "n", Limits: defaultLimits, Allocatable: alloc,
			Members: []Member{{Pair: "y", Role: Primary, VCPUs: 1, Requests: Resources{MilliCPU: 6500}}}}, RejectInsufficientCPU},
		{"a bound member counts once, in Requested", Node{Name: "n", Limits: defaultLimits, Allocatable: alloc, Requested: Resources{MilliCPU: 6000},
			Members: []Member{{Pair: "y", Role: Primary, VCPUs: 1, Requests: Resources{MilliCPU: 6000}, PodCounted: true}}}, ""},
		{"a reservation holds its room", Node{Name: "n", Limits: defaultLimits, Allocatable: alloc,
			Members: []Member{{Pair: "y", Role: Secondary, VCPUs: 1, Reserved: true, Requests: Resources{MemoryBytes: 30 * gi}}}}, RejectInsufficientMemory},
		{"the pair's own reservation is its room", Node{Name: "n", Limits: defaultLimits, Allocatable: alloc,
			Members: []Member{{Pair: "x", Role: Secondary, VCPUs: 1, Reserved: true, Requests: Resources{MemoryBytes: 30 * gi}}}}, ""},
		{"not reported: not counted", Node{Name: "n", Limits: defaultLimits, Requested: Resources{MilliCPU: 99000, MemoryBytes: 99 * gi}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Fits(c.node, Request{Pair: "x", Role: Secondary, VCPUs: 2, Requests: member}); got != c.want {
				t.Fatalf("Fits = %q, want %q", got, c.want)
			}
		})
	}
}

func TestPlacePairCountsThePrimarysRequestsForItsSecondary(t *testing.T) {
	const gi = int64(1) << 30
	// Two nodes with room for one 12 GiB member each, a third with room for one small one: the
	// pair needs both big nodes, and a new lone primary must not take the slot of a waiting
	// secondary sized as its primary.
	big := func(name string) Node {
		return Node{Name: name, Limits: defaultLimits, Allocatable: Resources{MilliCPU: 8000, MemoryBytes: 16 * gi}}
	}
	nodes := []Node{big("a"), big("b")}
	req := Resources{MilliCPU: 1000, MemoryBytes: 12 * gi}
	pp, err := PlacePair(nodes, Request{Pair: "x", Role: Primary, VCPUs: 1, Requests: req}, Request{Pair: "x", Role: Secondary, VCPUs: 1, Requests: req}, false)
	if err != nil || pp.Secondary == "" {
		t.Fatalf("PlacePair = %+v, %v", pp, err)
	}
	// The pair "w" runs a primary on a without a secondary: b is held for it.
	nodes = []Node{big("a"), big("b")}
	nodes[0].Members = []Member{{Pair: "w", Role: Primary, VCPUs: 1, Requests: req}}
	_, err = PlacePair(nodes, Request{Pair: "x", Role: Primary, VCPUs: 1, Requests: req}, Request{Pair: "x", Role: Secondary, VCPUs: 1, Requests: req}, false)
	var nee *NoEligibleNodeError
	if !errors.As(err, &nee) || nee.Rejected["a"] != RejectInsufficientMemory || nee.Rejected["b"] != RejectInsufficientMemory {
		t.Fatalf("want both nodes short of memory, got %v", err)
	}
}
