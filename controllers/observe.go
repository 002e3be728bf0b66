package controllers

import (
	"context"
	"sort"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/health"
	"github.com/lockstep-dev/lockstep/internal/roles"
)

// memberView is one member as observed.
type memberView struct {
	vmi     *virtv1.VirtualMachineInstance
	ordinal int
	node    string
	verdict health.Verdict
	// lockstepd: lockstepd runs on the member's node (it published its logging address), which
	// is then the one writer of the member's synchronization.
	lockstepd bool
}

// scope carries one reconcile's observations and decisions to the status computation.
type scope struct {
	ftvm *ftv1.FaultTolerantVM
	// members are the pair's member VMIs that are not being deleted; gone are those that are.
	members []*memberView
	gone    []*memberView
	// dropped are the secondaries this reconcile deleted (they are in members still).
	dropped []*memberView
	// record is the pair's record as last read or written.
	record *record

	primary   *memberView
	secondary *memberView
	// maxOrdinal is the highest ordinal seen or handed out (the record keeps it), so that new
	// members get new names.
	maxOrdinal int

	invalid        error  // the spec cannot be protected
	networkMissing string // why the logging network is not there
	adopting       string // what the adoption of spec.adoptFrom's VirtualMachine waits for
	primaryErr     error  // why no primary could be started
	secondaryErr   error  // why no secondary could be started
	// suspect are nodes where a member of the pair was lost or fenced and that have not proved
	// healthy since (suspects.go), or where its VMI is still going: a new secondary goes
	// elsewhere, since a node that just lost a member may be dying before the API server says so.
	suspect  []string
	promoted bool // a secondary was promoted in this reconcile
	// protectionOff: spec.protection keeps the pair without a secondary.
	protectionOff bool
	// operation is the FaultTolerantVMOperation that runs or is next (nil when none).
	operation *ftv1.FaultTolerantVMOperation
	// queued are the operations after it.
	queued  []*ftv1.FaultTolerantVMOperation
	waiting bool // the primary is lost and its suspect secondary is waited for
	// termWait: the holder cannot be seen but its term has not passed (term.go).
	termWait     *termWait
	restart      bool // no member can run the VM: a new pair starts from its disks
	requeueAfter time.Duration
	now          time.Time     // when the members were judged
	grace        time.Duration // the node-lost grace they were judged with
	sightings    *Sightings    // when the operator first saw what other machines' clocks wrote
}

func (s *scope) requeueWithin(d time.Duration) {
	if d > 0 && (s.requeueAfter == 0 || d < s.requeueAfter) {
		s.requeueAfter = d
	}
}

// member finds a member that is not being deleted by name.
func (s *scope) member(name string) *memberView {
	for _, mv := range s.members {
		if mv.vmi.Name == name {
			return mv
		}
	}
	return nil
}

// observe reads the members of the pair and the pair's record, and judges each member.
func (r *FaultTolerantVMReconciler) observe(ctx context.Context, ftvm *ftv1.FaultTolerantVM) (*scope, error) {
	s := &scope{ftvm: ftvm, sightings: r.Sightings}
	var vmis virtv1.VirtualMachineInstanceList
	if err := r.List(ctx, &vmis, client.InNamespace(ftvm.Namespace), client.MatchingFields{indexMemberByPair: ftvm.Name}); err != nil {
		return nil, err
	}
	for i := range vmis.Items {
		v := &vmis.Items[i]
		if !metav1.IsControlledBy(v, ftvm) {
			continue
		}
		mv := &memberView{vmi: v, node: v.Labels[ftv1.LabelNode]}
		mv.ordinal, _ = strconv.Atoi(v.Annotations[ftv1.AnnotationOrdinal])
		var node corev1.Node
		nodePtr := &node
		if err := r.Get(ctx, types.NamespacedName{Name: mv.node}, &node); apierrors.IsNotFound(err) {
			nodePtr = nil
		} else if err != nil {
			return nil, err
		}
		now := r.Clock.Now()
		mv.verdict = health.Judge(v, mv.node, nodePtr, now, r.Config.NodeLostGrace)
		mv.lockstepd = nodePtr != nil && node.Annotations[ftv1.AnnotationNodeLoggingAddress] != ""
		if r.Config.Member.COLO.Enabled && v.Labels[ftv1.LabelRole] == ftv1.RoleSecondary {
			// Its state, and its go-live, come only through its node's lockstepd, which must
			// still run there (its node lease), not only have run once.
			if running, expired := lockstepdOn(ctx, r.Client, r.Sightings, r.Config.LockstepdNamespace, nodePtr, now); !running {
				mv.verdict = health.WithoutLockstepd(mv.verdict, mv.node, expired, now, r.Config.NodeLostGrace)
			}
		}
		if mv.verdict.State == health.Suspect {
			s.requeueWithin(mv.verdict.RecheckAfter)
		}
		s.maxOrdinal = max(s.maxOrdinal, mv.ordinal)
		if v.DeletionTimestamp != nil {
			s.gone = append(s.gone, mv) // going away: it has no role any more, but its name stays taken
			s.suspect = append(s.suspect, mv.node)
			continue
		}
		s.members = append(s.members, mv)
	}
	sort.Slice(s.members, func(i, j int) bool { return s.members[i].ordinal < s.members[j].ordinal })
	copies, err := r.diskCopies(ctx, ftvm)
	if err != nil {
		return nil, err
	}
	for i := range copies {
		o, _ := strconv.Atoi(copies[i].Annotations[ftv1.AnnotationOrdinal])
		s.maxOrdinal = max(s.maxOrdinal, o)
	}
	if s.record, err = r.loadRecord(ctx, r.Client, ftvm); err != nil {
		return nil, err
	}
	s.maxOrdinal = max(s.maxOrdinal, s.record.LastOrdinal)
	if err := r.judgeSuspects(ctx, s); err != nil {
		return nil, err
	}
	s.now, s.grace = r.Clock.Now(), r.Config.NodeLostGrace
	s.judgeReplication()
	if err := r.loadOperations(ctx, s); err != nil {
		return nil, err
	}
	return s, nil
}

// judgeReplication applies lockstepd's reports: it sees a lost peer long before the node
// lifecycle does, and a secondary that went live holds the Lease, so its primary is lost at once.
func (s *scope) judgeReplication() {
	var p, sec *memberView
	for _, mv := range s.members {
		switch mv.vmi.Labels[ftv1.LabelRole] {
		case ftv1.RolePrimary:
			if mv.vmi.Name == s.record.Holder || p == nil {
				p = mv
			}
		case ftv1.RoleSecondary:
			if sec == nil {
				sec = mv
			}
		}
	}
	name := func(mv *memberView) string {
		if mv == nil {
			return ""
		}
		return mv.vmi.Name
	}
	rep := s.ftvm.Status.Replication
	var secCreated time.Time
	if sec != nil {
		secCreated = sec.vmi.CreationTimestamp.Time
	}
	pv, sv := health.FromReplication(rep, name(p), name(sec), secCreated)
	if pv != nil {
		p.verdict = *pv
	}
	if sv != nil {
		sec.verdict = *sv
	}
	if rep == nil {
		return
	}
	// A member whose node went silent runs on while its own lockstepd reports it replicating.
	for _, mv := range []*memberView{p, sec} {
		if mv == nil {
			continue
		}
		for _, side := range []*ftv1.SideStatus{rep.Primary, rep.Secondary} {
			if side != nil && side.VMI == mv.vmi.Name && side.Node == mv.node {
				seen := s.sightings.Seen("report/"+s.ftvm.Namespace+"/"+s.ftvm.Name+"/"+side.VMI, side.ReportTime.UTC().Format(time.RFC3339Nano), s.now)
				mv.verdict = health.Vouch(mv.verdict, side, mv.vmi.Name, seen, s.now, s.grace)
			}
		}
		if mv.verdict.Reason == health.ReasonNodeSilentReplicating {
			s.requeueWithin(mv.verdict.RecheckAfter)
		}
	}
}

// roleMembers is what the decision needs of the members.
func (s *scope) roleMembers() []roles.Member {
	out := make([]roles.Member, 0, len(s.members))
	for _, mv := range s.members {
		epoch, _ := strconv.ParseInt(mv.vmi.Annotations[ftv1.AnnotationEpoch], 10, 64)
		out = append(out, roles.Member{
			Name: mv.vmi.Name, Ordinal: mv.ordinal, Role: mv.vmi.Labels[ftv1.LabelRole],
			Health: roleHealth(mv.verdict.State), Synced: s.holdsState(mv), Epoch: epoch,
			Follows: mv.vmi.Annotations[ftv1.AnnotationFollows],
		})
	}
	return out
}

func roleHealth(st health.State) roles.Health {
	switch st {
	case health.Running:
		return roles.Running
	case health.Suspect:
		return roles.Suspect
	case health.Lost:
		return roles.Lost
	}
	return roles.Pending
}

// holdsState says whether the member may take over the VM: it was synchronized once, and
// lockstepd does not report it unsynchronized now.
func (s *scope) holdsState(mv *memberView) bool { return mv.synced() && !s.reportedUnsynced(mv) }

// reportedUnsynced says whether lockstepd reports the member as a secondary that does not hold
// the pair's state (it restarted, or its protection ended): such a member is never promoted,
// whatever its synced-at annotation says.
func (s *scope) reportedUnsynced(mv *memberView) bool {
	r := s.ftvm.Status.Replication
	return r != nil && r.Secondary != nil && r.Secondary.VMI == mv.vmi.Name && !r.Secondary.Synchronized
}

// alive says whether the member may be running its side: Running, or Suspect (its node or
// lockstepd silent, not yet judged lost). A nil member is not.
func (mv *memberView) alive() bool {
	return mv != nil && (mv.verdict.State == health.Running || mv.verdict.State == health.Suspect)
}

// synced says whether the member held its pair's state once (see phaseMarkSynced).
func (mv *memberView) synced() bool {
	_, ok := mv.vmi.Annotations[ftv1.AnnotationSyncedAt]
	return ok
}
