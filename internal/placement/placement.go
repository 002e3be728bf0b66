// Package placement decides on which node a member of a fault tolerant pair runs.
//
// It is pure: no Kubernetes, no I/O. The operator turns its view of the cluster into Nodes and
// asks Place for a node. The rules come from the vSphere FT white paper (sections 2.5-2.7):
//   - the two members of a pair never share a node (nor a topology domain, when one is asked);
//   - a node never holds more FT members, or more FT vCPUs, than its FT limit;
//   - a node's logging bandwidth budget covers what all its members send and receive: a failover
//     turns a receiving secondary into a sending primary without asking placement, so only a
//     budget that does not depend on the role holds across failovers;
//   - FT logging traffic is asymmetric (the primary sends, the secondary receives), so among the
//     nodes that fit, the one whose traffic in the member's direction stays lowest wins:
//     primaries spread out, and a node ends up with primaries of some pairs and secondaries of
//     others;
//   - a member's launcher pod gets the node's CPU and memory as the scheduler counts them: what
//     the node can allocate, less what its pods request, counts besides the FT limits, so that a
//     member is never pinned to a node where it could only run by preempting another pod.
package placement

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Role is the role of a member in its pair.
type Role string

const (
	Primary   Role = "primary"
	Secondary Role = "secondary"
)

// Limits is a node's FT capacity.
type Limits struct {
	// MaxMembers is the most FT members (primaries and secondaries) the node may hold.
	MaxMembers int
	// MaxVCPUs is the most vCPUs of FT members the node may hold.
	MaxVCPUs int
	// LogBandwidthMbps is the logging bandwidth of the node, in Mbit/s, for the traffic of all its
	// members. Zero means the bandwidth is not budgeted.
	LogBandwidthMbps int
}

// Resources are CPU and memory as the scheduler counts them: what pods request, what a node can
// allocate.
type Resources struct {
	MilliCPU, MemoryBytes int64
}

// Add is r plus o.
func (r Resources) Add(o Resources) Resources {
	return Resources{MilliCPU: r.MilliCPU + o.MilliCPU, MemoryBytes: r.MemoryBytes + o.MemoryBytes}
}

// Member is an FT member placed on a node. Members that placement has decided on but that the
// cluster does not show yet must be included too, or a limit can be exceeded.
type Member struct {
	Pair             string
	Role             Role
	VCPUs            int
	LogBandwidthMbps int
	// Reserved: a reservation, not a running member (the secondary of a pair whose protection is
	// suspended keeps its node so). It counts against the node's limits for every other pair, and
	// its own pair's next secondary takes its place there first.
	Reserved bool
	// Alone: a primary whose pair keeps no secondary by choice (protection Disabled): no slot is
	// held for one.
	Alone bool
	// Requests is what the member's launcher pod requests of its node.
	Requests Resources
	// PodCounted: the member's launcher pod is bound to the node, so the node's Requested already
	// holds its Requests.
	PodCounted bool
}

// Node is a node as placement sees it.
type Node struct {
	Name string
	// Domain is the node's value of the pair's topology key ("" when none is asked).
	Domain string
	// Unavailable, when not empty, says why no member may be placed here (NotReady, cordoned,
	// tainted, does not match the VM's node selector, ...).
	Unavailable string
	Limits      Limits
	Members     []Member
	// Allocatable is the node's allocatable CPU and memory; a zero field is not reported, and that
	// resource is not counted on the node.
	Allocatable Resources
	// Requested is what the pods bound to the node request, members' launcher pods included.
	Requested Resources
}

// Request asks for a node for one member.
type Request struct {
	Pair             string
	Role             Role
	VCPUs            int
	LogBandwidthMbps int
	// AvoidNodes are nodes the member must not use: the node of the other member.
	AvoidNodes []string
	// AvoidDomains are topology domains the member must not use: the other member's domain.
	AvoidDomains []string
	// SuspectNodes are nodes that lost a member of the pair and have not proved healthy since: they may be
	// dying before the API server says so. Not avoided when Node names one (a person chose it).
	SuspectNodes []string
	// Node, when set, is the only node the member may use (a migration to a chosen node).
	Node string
	// PreferNode, when set, is the node to use when it fits, before any other: the node where a
	// new secondary can take over an earlier secondary's copies of the disks.
	PreferNode string
	// Requests is what the member's launcher pod will request of its node.
	Requests Resources
}

// Member is the member req places, as a node counts it once placed.
func (req Request) Member() Member {
	return Member{Pair: req.Pair, Role: req.Role, VCPUs: req.VCPUs, LogBandwidthMbps: req.LogBandwidthMbps, Requests: req.Requests}
}

// Reasons a node is rejected, as they appear in Decision.Rejected.
const (
	RejectAntiAffinity   = "holds the other member of the pair"
	RejectSameDomain     = "in the other member's topology domain"
	RejectSamePair       = "already holds a member of this pair"
	RejectMemberLimit    = "FT VM limit reached"
	RejectVCPULimit      = "FT vCPU limit reached"
	RejectLogBandwidth   = "logging bandwidth budget exhausted"
	RejectNoTopologyInfo = "has no value for the topology key"
	RejectNotAsked       = "not the node asked for"
	RejectSuspect        = "lost a member of this pair and has not proved healthy since (a lease renewed by its lockstepd or kubelet, or Ready again)"
	// As the scheduler says them.
	RejectInsufficientCPU    = "Insufficient cpu"
	RejectInsufficientMemory = "Insufficient memory"
)

// ErrNoEligibleNode is returned (wrapped in a *NoEligibleNodeError) when no node fits.
var ErrNoEligibleNode = errors.New("no eligible node")

// NoEligibleNodeError says why each node was rejected.
type NoEligibleNodeError struct {
	Rejected map[string]string
}

func (e *NoEligibleNodeError) Error() string {
	return fmt.Sprintf("0/%d nodes are eligible: %s", len(e.Rejected), Summarize(e.Rejected))
}

func (e *NoEligibleNodeError) Unwrap() error { return ErrNoEligibleNode }

// Summarize counts the rejection reasons, like the scheduler's "3 Insufficient cpu, 2 ...".
func Summarize(rejected map[string]string) string {
	counts := map[string]int{}
	for _, reason := range rejected {
		counts[reason]++
	}
	reasons := make([]string, 0, len(counts))
	for r := range counts {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	parts := make([]string, 0, len(reasons))
	for _, r := range reasons {
		parts = append(parts, fmt.Sprintf("%d %s", counts[r], r))
	}
	if len(parts) == 0 {
		return "no nodes"
	}
	return strings.Join(parts, ", ")
}

// Usage is what a node holds.
type Usage struct {
	Members, VCPUs     int
	Primaries          int
	SendMbps, RecvMbps int
	// Requested is what the node's pods request and what its members whose pods are not bound yet
	// (or reservations) will.
	Requested Resources
}

// UsageOf sums a node's members.
func UsageOf(n Node) Usage {
	u := Usage{Requested: n.Requested}
	for _, m := range n.Members {
		u.Members++
		u.VCPUs += m.VCPUs
		if !m.PodCounted {
			u.Requested = u.Requested.Add(m.Requests)
		}
		if m.Role == Primary {
			u.Primaries++
			u.SendMbps += m.LogBandwidthMbps
		} else {
			u.RecvMbps += m.LogBandwidthMbps
		}
	}
	return u
}

// withoutReservation is n without pair's reservation: the room it holds is the pair's own.
func withoutReservation(n Node, pair string) Node {
	out := n
	out.Members = make([]Member, 0, len(n.Members))
	for _, m := range n.Members {
		if !m.Reserved || m.Pair != pair {
			out.Members = append(out.Members, m)
		}
	}
	return out
}

// reservedFor says whether n holds pair's reservation.
func reservedFor(n Node, pair string) bool {
	for _, m := range n.Members {
		if m.Reserved && m.Pair == pair {
			return true
		}
	}
	return false
}

// Fits says why the node cannot take the request, or "" when it can.
func Fits(n Node, req Request) string {
	if req.Node != "" && n.Name != req.Node {
		return RejectNotAsked
	}
	if n.Unavailable != "" {
		return n.Unavailable
	}
	for _, a := range req.AvoidNodes {
		if a == n.Name {
			return RejectAntiAffinity
		}
	}
	for _, a := range req.SuspectNodes {
		if a == n.Name && req.Node == "" {
			return RejectSuspect
		}
	}
	if len(req.AvoidDomains) > 0 {
		if n.Domain == "" {
			return RejectNoTopologyInfo
		}
		for _, d := range req.AvoidDomains {
			if d == n.Domain {
				return RejectSameDomain
			}
		}
	}
	for _, m := range n.Members {
		if m.Pair == req.Pair && !m.Reserved {
			return RejectSamePair
		}
	}
	u := UsageOf(withoutReservation(n, req.Pair))
	if u.Members+1 > n.Limits.MaxMembers {
		return RejectMemberLimit
	}
	if u.VCPUs+req.VCPUs > n.Limits.MaxVCPUs {
		return RejectVCPULimit
	}
	if bw := n.Limits.LogBandwidthMbps; bw > 0 && u.SendMbps+u.RecvMbps+req.LogBandwidthMbps > bw {
		return RejectLogBandwidth
	}
	after := u.Requested.Add(req.Requests)
	if a := n.Allocatable.MilliCPU; a > 0 && after.MilliCPU > a {
		return RejectInsufficientCPU
	}
	if a := n.Allocatable.MemoryBytes; a > 0 && after.MemoryBytes > a {
		return RejectInsufficientMemory
	}
	return ""
}

// directional is the node's logging traffic in the direction the member adds to.
func directional(u Usage, role Role) int {
	if role == Primary {
		return u.SendMbps
	}
	return u.RecvMbps
}

// Place picks the node for a member: among the nodes that fit, the preferred one, then the one
// holding the pair's reservation, then the one whose logging traffic in
// the member's direction is lowest, then the one with the fewest members, then the fewest FT
// vCPUs, then by name, so that the answer is deterministic.
func Place(nodes []Node, req Request) (string, error) {
	ranked, err := rank(nodes, req)
	if err != nil {
		return "", err
	}
	return ranked[0], nil
}

// rank lists the nodes that fit req, best first (Place's order).
func rank(nodes []Node, req Request) ([]string, error) {
	type candidate struct {
		name string
		key  [5]int
	}
	rejected := map[string]string{}
	var fit []candidate
	for _, n := range nodes {
		if why := Fits(n, req); why != "" {
			rejected[n.Name] = why
			continue
		}
		u := UsageOf(withoutReservation(n, req.Pair))
		own := 1
		if reservedFor(n, req.Pair) {
			own = 0 // the pair's own reservation first
		}
		preferred := 1
		if n.Name == req.PreferNode {
			preferred = 0
		}
		fit = append(fit, candidate{n.Name, [5]int{preferred, own, directional(u, req.Role), u.Members, u.VCPUs}})
	}
	if len(fit) == 0 {
		return nil, &NoEligibleNodeError{Rejected: rejected}
	}
	sort.SliceStable(fit, func(i, j int) bool {
		if fit[i].key != fit[j].key {
			return less(fit[i].key, fit[j].key)
		}
		return fit[i].name < fit[j].name
	})
	names := make([]string, len(fit))
	for i, c := range fit {
		names[i] = c.name
	}
	return names, nil
}

// PairPlacement is where a new pair starts. Secondary is "" when no two nodes can take the pair
// but one can take the primary: the VM then runs NotProtected until a node frees up, as an FT VM
// does in vSphere; SecondaryErr says why.
type PairPlacement struct {
	Primary, Secondary string
	SecondaryErr       error
}

// PlacePair places both members of a new pair at once: the best node for the primary among those
// that leave a node for the secondary, and the secondary where Place would put it next to that
// primary. Placing the primary alone first would let many pairs starting together take every
// node's last slot with a lone primary, leaving fewer VMs protected than the nodes could hold.
// Re-protecting a running VM comes first: a slot is held for the secondary of every pair that
// runs without one (HoldWaitingSecondaries). With separateDomains the secondary also avoids the
// primary's topology domain. The error is the primary's *NoEligibleNodeError when not even the
// primary fits.
func PlacePair(nodes []Node, primary, secondary Request, separateDomains bool) (PairPlacement, error) {
	nodes = HoldWaitingSecondaries(nodes)
	candidates, err := rank(nodes, primary)
	if err != nil {
		return PairPlacement{}, err
	}
	var firstErr error
	for _, p := range candidates {
		with := make([]Node, len(nodes))
		copy(with, nodes)
		req := secondary
		req.AvoidNodes = append(append([]string{}, secondary.AvoidNodes...), p)
		for i := range with {
			if with[i].Name != p {
				continue
			}
			with[i].Members = append(append([]Member{}, with[i].Members...), primary.Member())
			if separateDomains {
				req.AvoidDomains = append(append([]string{}, secondary.AvoidDomains...), with[i].Domain)
			}
		}
		s, err := Place(with, req)
		if err == nil {
			return PairPlacement{Primary: p, Secondary: s}, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return PairPlacement{Primary: candidates[0], SecondaryErr: firstErr}, nil
}

func less(a, b [5]int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// HoldWaitingSecondaries returns a copy of nodes in which each pair that runs a primary without a
// secondary also has its secondary placed (where Place would put it, away from the primary's
// node; pairs in name order), so that a new pair cannot take the slot that would protect a
// running VM. A secondary that fits nowhere holds nothing. Topology domains are not considered:
// the nodes carry the domain of the requesting pair's key, not of each waiting pair's.
func HoldWaitingSecondaries(nodes []Node) []Node {
	out := make([]Node, len(nodes))
	primaries := map[string]Member{}
	primaryNode := map[string]string{}
	hasSecondary := map[string]bool{}
	for i, n := range nodes {
		out[i] = n
		out[i].Members = append([]Member{}, n.Members...)
		for _, m := range n.Members {
			switch m.Role {
			case Primary:
				if !m.Alone {
					primaries[m.Pair], primaryNode[m.Pair] = m, n.Name
				}
			case Secondary:
				hasSecondary[m.Pair] = true
			}
		}
	}
	waiting := make([]string, 0, len(primaries))
	for pair := range primaries {
		if !hasSecondary[pair] {
			waiting = append(waiting, pair)
		}
	}
	sort.Strings(waiting)
	for _, pair := range waiting {
		m := primaries[pair]
		// Sized as its primary: the secondary's own request (a COLO secondary's RAM cache) is
		// known only to its FaultTolerantVM's next decision.
		req := Request{Pair: pair, Role: Secondary, VCPUs: m.VCPUs, LogBandwidthMbps: m.LogBandwidthMbps, Requests: m.Requests,
			AvoidNodes: []string{primaryNode[pair]}}
		node, err := Place(out, req)
		if err != nil {
			continue
		}
		for i := range out {
			if out[i].Name == node {
				out[i].Members = append(out[i].Members, req.Member())
			}
		}
	}
	return out
}

// LogBandwidthMbps is the white paper's sizing formula (section 2.10): FT logging bandwidth in
// Mbit/s ~= (disk read MB/s * 8 + network receive Mbit/s) * 1.2, rounded up.
func LogBandwidthMbps(diskReadMBps, networkReceiveMbps int) int {
	return withHeadroom(diskReadMBps*8 + networkReceiveMbps)
}

// COLOLogBandwidthMbps is lockstep's sizing formula for COLO members, from what each of COLO's
// streams carried in make bench-workloads (docs/performance.md): to the secondary, the pages the
// guest dirtied (the checkpoints), its disk writes (block replication) and what it received
// (the mirror); back from it, what it transmitted (colo-compare's copy). Both directions count,
// as a node's budget covers what its members send and receive; with the white paper's 20%
// headroom, rounded up.
func COLOLogBandwidthMbps(memoryDirtyMBps, diskWriteMBps, networkReceiveMbps, networkTransmitMbps int) int {
	return withHeadroom((memoryDirtyMBps+diskWriteMBps)*8 + networkReceiveMbps + networkTransmitMbps)
}

// withHeadroom is the white paper's 20% over a raw logging rate, rounded up.
func withHeadroom(rawMbps int) int {
	return (rawMbps*12 + 9) / 10
}
