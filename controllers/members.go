package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/health"
	"github.com/lockstep-dev/lockstep/internal/kubevirtsize"
	"github.com/lockstep-dev/lockstep/internal/member"
	"github.com/lockstep-dev/lockstep/internal/placement"
)

// phaseMarkSynced marks a secondary that holds the primary's state. A secondary that started
// while its primary's node was already failing never received that state, and promoting it would
// lose the VM's memory and recent writes (a restart from disk is the honest outcome then). Where
// lockstepd runs on the secondary's node, lockstepd alone marks it, from its engine's real end
// of the initial synchronization. Under COLO it is always lockstepd's: a COLO secondary holds the
// VM only once lockstepd's engine migrated it there, so one on a node where lockstepd does not
// run holds nothing, however long it ran, and must never be marked (and so never promoted).
// Only without COLO, where no lockstepd runs (a cluster without the data plane), does the
// operator infer it: once the secondary has run beside a primary on a healthy node.
func (r *FaultTolerantVMReconciler) phaseMarkSynced(ctx context.Context, s *scope) error {
	sec, p := s.secondary, s.primary
	if sec == nil || p == nil || sec.synced() || sec.verdict.State != health.Running || p.verdict.State != health.Running {
		return nil
	}
	if sec.lockstepd || r.Config.Member.COLO.Enabled {
		// lockstepd runs there: it marks the secondary when its engine finished the initial
		// synchronization (the one writer of the fact); the operator's inference would be a guess.
		return nil
	}
	base := sec.vmi.DeepCopy()
	if sec.vmi.Annotations == nil {
		sec.vmi.Annotations = map[string]string{}
	}
	sec.vmi.Annotations[ftv1.AnnotationSyncedAt] = r.Clock.Now().UTC().Format(time.RFC3339)
	if err := r.Patch(ctx, sec.vmi, client.MergeFrom(base)); err != nil {
		return client.IgnoreNotFound(err)
	}
	return nil
}

// phaseStartPair starts a new (or restarted) pair when no member can run the VM: both members
// in one placement decision, so that pairs starting together fill nodes with whole pairs rather
// than lone primaries.
func (r *FaultTolerantVMReconciler) phaseStartPair(ctx context.Context, s *scope) error {
	if !s.restart || !s.canStartMembers() {
		return nil
	}
	return r.startPair(ctx, s, member.Normalize(s.ftvm.UID, s.ftvm.Spec.Template))
}

// phaseEnsureSecondary starts a secondary for a primary that has none, from the template the
// primary runs.
func (r *FaultTolerantVMReconciler) phaseEnsureSecondary(ctx context.Context, s *scope) error {
	if s.primary == nil || s.secondary != nil || s.secondaryErr != nil || s.waiting || s.primary.verdict.State == health.Lost || s.protectionOff {
		return nil
	}
	if s.networkMissing != "" {
		return nil
	}
	tmpl := secondaryTemplate(ctx, s, s.primary)
	bytes, err := r.secondaryDiskBytes(s.primary.vmi, &tmpl.Spec)
	if err != nil {
		return r.recordPlacementError(s, &s.secondaryErr, err)
	}
	mv, err := r.startSecondary(ctx, s, tmpl, bytes)
	if err != nil {
		return r.recordPlacementError(s, &s.secondaryErr, err)
	}
	s.secondary = mv
	return nil
}

// recordPlacementError keeps a placement failure for the status and retries later; other errors
// are returned.
func (r *FaultTolerantVMReconciler) recordPlacementError(s *scope, into *error, err error) error {
	if errors.Is(err, errWaitingForCopies) {
		*into = err
		s.requeueWithin(copiesRecheck) // and the VMI's deletion wakes the reconcile
		return nil
	}
	if errors.Is(err, placement.ErrNoEligibleNode) || errors.Is(err, errSourceClaim) || errors.Is(err, errDiskSizesUnknown) ||
		errors.Is(err, member.ErrDiskSizeUnsupported) {
		*into = err
		s.requeueWithin(r.Config.RetryInterval)
		return nil
	}
	return r.retryOnRace(s, err)
}

// newMember is a member about to be placed and created.
type newMember struct {
	name string
	tmpl ftv1.VMITemplate
	spec member.Member
	req  placement.Request
	// reuse, on a secondary, is the copies it takes over if it is placed on their node.
	reuse *replicaSet
	vmi   *virtv1.VirtualMachineInstance // set once created
}

// prepareMember is a member to place, sized as the cluster's KubeVirt (sizing) will size its launcher.
func (r *FaultTolerantVMReconciler) prepareMember(s *scope, tmpl ftv1.VMITemplate, role string, ordinal int, sizing kubevirtsize.Cluster) *newMember {
	ftvm := s.ftvm
	m := member.Member{Ordinal: ordinal, Role: role, Since: r.Clock.Now(), LogBandwidthMbps: r.logBandwidthMbps(ftvm)}
	if role == ftv1.RoleSecondary && s.primary != nil {
		m.Follows = s.primary.vmi.Name
	}
	// A template admission let through has what sizing needs (its memory): an error leaves the
	// member counted by the FT limits alone, as before it was sized.
	cpu, memory, _ := member.LauncherRequests(tmpl, role, r.Config.Member, sizing)
	return &newMember{
		name: member.Name(ftvm.Name, ordinal),
		tmpl: tmpl,
		spec: m,
		req: placement.Request{Pair: pairKey(ftvm.Namespace, ftvm.Name), Role: placement.Role(role),
			VCPUs: member.VCPUs(&tmpl.Spec), LogBandwidthMbps: m.LogBandwidthMbps,
			Requests: placement.Resources{MilliCPU: cpu, MemoryBytes: memory}},
	}
}

func (nm *newMember) key(s *scope) types.NamespacedName {
	return types.NamespacedName{Namespace: s.ftvm.Namespace, Name: nm.name}
}

// create creates the member (and its disk copies) on node; the Placer calls it.
func (r *FaultTolerantVMReconciler) create(ctx context.Context, s *scope, nm *newMember, node string) error {
	nm.spec.Node = node
	if nm.reuse != nil && nm.reuse.node != node {
		nm.reuse = nil // placed elsewhere: blank copies
	}
	if nm.reuse != nil {
		nm.spec.ReplicaOf = nm.reuse.of
	}
	disks, err := r.ensureMemberClaims(ctx, s.ftvm, &nm.tmpl.Spec, nm.name, nm.spec, nm.reuse)
	if err != nil {
		return err
	}
	nm.spec.Claims, nm.spec.DiskSizes, nm.spec.DiskBytes = disks.claims, disks.sizes, disks.bytes
	vmi, err := member.Build(s.ftvm, nm.tmpl, nm.spec, r.Config.Member)
	if err != nil {
		return err
	}
	if err := controllerutil.SetControllerReference(s.ftvm, vmi, r.Scheme); err != nil {
		return err
	}
	if err := r.Create(ctx, vmi); err != nil {
		return err
	}
	nm.vmi = vmi
	return nil
}

// created records a created member in the scope and the log, and waits until the cache holds
// it: reconciles of one FaultTolerantVM run one at a time, so the next one then sees the member,
// and never starts a second one in its place from a cache that trails this write. Its caller
// announces it (one event for a new pair).
func (r *FaultTolerantVMReconciler) created(ctx context.Context, s *scope, nm *newMember) *memberView {
	s.maxOrdinal = max(s.maxOrdinal, nm.spec.Ordinal)
	r.awaitCached(ctx, nm.vmi)
	log.FromContext(ctx).Info("created member", "vmi", nm.name, "role", nm.spec.Role, "node", nm.spec.Node)
	return &memberView{vmi: nm.vmi, ordinal: nm.spec.Ordinal, node: nm.spec.Node, verdict: health.Verdict{State: health.Pending, Reason: string(virtv1.Pending),
		Message: fmt.Sprintf("VMI %s was just created on node %s", nm.name, nm.spec.Node)}}
}

// cacheSyncTimeout bounds the wait for the cache to show the operator's own create.
const cacheSyncTimeout = 10 * time.Second

// awaitCached waits until the cache holds obj (created by this reconcile), or the timeout runs out.
func (r *FaultTolerantVMReconciler) awaitCached(ctx context.Context, obj client.Object) {
	key := client.ObjectKeyFromObject(obj)
	probe := obj.DeepCopyObject().(client.Object)
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, cacheSyncTimeout, true, func(ctx context.Context) (bool, error) {
		return r.Get(ctx, key, probe) == nil, nil
	})
	if err != nil {
		log.FromContext(ctx).Info("the cache does not show a member this reconcile created yet", "vmi", key.Name)
	}
}

// startPair places and creates both members of a new pair; when only the primary fits, it starts
// alone and the status says why it is not protected.
//
// Under COLO the secondary is built from the primary's disk sizes: when the VM starts from the
// template's claims they are known only once the primary runs (lockstepd measures them), so
// the pair is placed as a whole but only the primary is created; phaseEnsureSecondary creates
// the secondary once the sizes are there.
func (r *FaultTolerantVMReconciler) startPair(ctx context.Context, s *scope, tmpl ftv1.VMITemplate) error {
	sizing := r.Placer.Sizing.Cluster(ctx)
	p := r.prepareMember(s, tmpl, ftv1.RolePrimary, s.maxOrdinal+1, sizing)
	sec := r.prepareMember(s, tmpl, ftv1.RoleSecondary, s.maxOrdinal+2, sizing)
	sec.spec.Follows = p.name
	withSecondary := true
	pp, err := r.Placer.PlaceAndCreatePair(ctx, p.req, sec.req, &tmpl.Spec, s.ftvm.Spec.TopologyKey, p.key(s), sec.key(s),
		func(node, secondaryNode string) error {
			if err := r.checkClaims(ctx, s.ftvm, &tmpl.Spec, ftv1.RolePrimary); err != nil {
				return err // before the record: a refused start spends no epoch
			}
			if r.Config.Member.COLO.Enabled {
				// Decided once: the primary's sizes (known when it starts from copies), and from
				// them whether the secondary is made now and its name reserved with the primary's.
				copies, err := r.diskCopies(ctx, s.ftvm)
				if err != nil {
					return err
				}
				p.spec.DiskBytes = currentDiskBytes(copies, &tmpl.Spec)
				withSecondary = p.spec.DiskBytes != nil
			}
			// The new primary takes the record before it exists: a crash between the two leaves a
			// holder that never ran, which the next reconcile finds gone and replaces.
			next := s.record.Record
			next.Exists, next.Holder, next.Epoch = true, p.name, s.record.Epoch+1
			next.LastOrdinal = max(next.LastOrdinal, p.spec.Ordinal)
			listed := []string{ftv1.SideIdentity(node, p.name)}
			if withSecondary {
				next.LastOrdinal = max(next.LastOrdinal, sec.spec.Ordinal) // both names, in the one write
				if secondaryNode != "" {
					listed = append(listed, ftv1.SideIdentity(secondaryNode, sec.name))
				}
			}
			if err := r.writeRecordListing(ctx, s.ftvm, s.record, next, node, s.listing(listed...)); err != nil {
				return err
			}
			p.spec.Epoch = next.Epoch
			return r.create(ctx, s, p, node)
		},
		func(node string) error {
			// Without the primary's sizes, errDiskSizesUnknown: the secondary waits for them, and
			// takes a name of its own then (its ordinal was not reserved).
			bytes, err := r.secondaryDiskBytes(p.vmi, &tmpl.Spec)
			if err == nil && !withSecondary {
				err = fmt.Errorf("%w: the primary's disk sizes were not known when the pair started", errDiskSizesUnknown)
			}
			if err != nil {
				return err
			}
			sec.spec.DiskBytes = bytes
			return r.create(ctx, s, sec, node)
		})
	if pp.Primary != "" {
		s.primary = r.created(ctx, s, p)
	}
	if pp.Secondary != "" {
		s.secondary = r.created(ctx, s, sec)
	} else if pp.SecondaryErr != nil {
		_ = r.recordPlacementError(s, &s.secondaryErr, pp.SecondaryErr) // a NoEligibleNodeError
	}
	if pp.Primary != "" {
		// One event for the pair: at a thousand VMs started at once, an event a member was a
		// tenth of the operator's requests.
		note := fmt.Sprintf("primary %s placed on node %s", p.name, pp.Primary)
		if pp.Secondary != "" {
			note += fmt.Sprintf(", secondary %s on node %s", sec.name, pp.Secondary)
		}
		r.Recorder.Eventf(s.ftvm, p.vmi, corev1.EventTypeNormal, ftv1.ReasonMemberCreated, "Create", "%s", note)
	}
	if pp.Primary != "" && (errors.Is(err, errDiskSizesUnknown) || errors.Is(err, member.ErrDiskSizeUnsupported)) {
		// The primary runs; lockstepd's measure of its disks (a change of its VMI) or the retry
		// brings the secondary.
		return r.recordPlacementError(s, &s.secondaryErr, err)
	}
	switch {
	case apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err):
		// The cache trails our own earlier create, or the record moved on; the next reconcile
		// sees it.
		s.requeueWithin(time.Second)
		return errStop
	case err != nil && pp.Primary == "":
		return r.recordPlacementError(s, &s.primaryErr, err)
	default:
		return err
	}
}

// secondaryTemplate is what a new secondary beside primary is built from: the template the
// primary runs. Only a member edited by hand lacks it; the FaultTolerantVM's is the best guess.
func secondaryTemplate(ctx context.Context, s *scope, primary *memberView) ftv1.VMITemplate {
	tmpl, err := member.DecodeTemplate(primary.vmi)
	if err != nil {
		log.FromContext(ctx).Error(err, "building the secondary from the FaultTolerantVM's template")
		return member.Normalize(s.ftvm.UID, s.ftvm.Spec.Template)
	}
	return tmpl
}

// awayFrom keeps a new secondary off primary's node and, with a topology key, off its domain;
// nodes under suspicion rank last.
func (r *FaultTolerantVMReconciler) awayFrom(ctx context.Context, s *scope, primary *memberView, req *placement.Request) error {
	req.AvoidNodes, req.SuspectNodes = []string{primary.node}, s.suspect
	if key := s.ftvm.Spec.TopologyKey; key != "" {
		var pn corev1.Node
		if err := r.Get(ctx, types.NamespacedName{Name: primary.node}, &pn); err != nil {
			return err
		}
		req.AvoidDomains = []string{pn.Labels[key]}
	}
	return nil
}

// startSecondary places a new secondary away from the primary and creates it (and its disk
// copies).
func (r *FaultTolerantVMReconciler) startSecondary(ctx context.Context, s *scope, tmpl ftv1.VMITemplate, bytes member.DiskBytes) (*memberView, error) {
	nm := r.prepareMember(s, tmpl, ftv1.RoleSecondary, s.maxOrdinal+1, r.Placer.Sizing.Cluster(ctx))
	nm.spec.DiskBytes = bytes
	if err := r.awayFrom(ctx, s, s.primary, &nm.req); err != nil {
		return nil, err
	}
	if node, avoid := s.operationPlacement(); node != "" || avoid != "" {
		nm.req.Node = node // a migration of the secondary
		if avoid != "" {
			nm.req.SuspectNodes = append(nm.req.SuspectNodes, avoid)
		}
	} else {
		set, ok, err := r.replicasFor(ctx, s, pvcVolumes(&tmpl.Spec), bytes)
		if err != nil {
			return nil, err // errWaitingForCopies among them
		}
		if ok {
			nm.reuse, nm.req.PreferNode = &set, set.node
		}
	}
	_, err := r.Placer.PlaceAndCreate(ctx, nm.req, &tmpl.Spec, s.ftvm.Spec.TopologyKey, nm.key(s), func(node string) error {
		// The name is handed out only once a node holds the member: a VM that waits for room
		// neither writes its record at every try nor spends a name at each.
		if err := r.checkClaims(ctx, s.ftvm, &tmpl.Spec, ftv1.RoleSecondary); err != nil {
			return err
		}
		if err := r.recordNewMember(ctx, s, nm, node); err != nil {
			return err
		}
		return r.create(ctx, s, nm, node)
	})
	if apierrors.IsConflict(err) {
		return nil, r.retryOnRace(s, err) // the record moved on since this reconcile read it
	}
	if apierrors.IsAlreadyExists(err) {
		// The cache trails our own earlier create; the next reconcile sees the member.
		s.requeueWithin(time.Second)
		return nil, errStop
	}
	if err != nil {
		return nil, err
	}
	mv := r.created(ctx, s, nm)
	note := ""
	if nm.spec.ReplicaOf != "" {
		note = fmt.Sprintf(", with the copies of the disks that %s left: only what the VM wrote since is copied", nm.spec.ReplicaOf)
	}
	r.Recorder.Eventf(s.ftvm, nm.vmi, corev1.EventTypeNormal, ftv1.ReasonMemberCreated, "Create", "%s %s placed on node %s%s", nm.spec.Role, nm.name, nm.spec.Node, note)
	return mv, nil
}

// logBandwidthMbps is the logging bandwidth reserved for the VM (member.LogBandwidthMbps).
func (r *FaultTolerantVMReconciler) logBandwidthMbps(ftvm *ftv1.FaultTolerantVM) int {
	return member.LogBandwidthMbps(ftvm, r.Config.DefaultLogBandwidthMbps, r.Config.Member.COLO.Enabled)
}
