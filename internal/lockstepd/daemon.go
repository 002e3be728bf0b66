// Package lockstepd is the node daemon: it finds the FT members on its node in the API, gives
// each an agent (internal/agent) around its VM engine, carries what the agents decide into the
// API (fenced members deleted, synchronized secondaries marked) and reports to the
// FaultTolerantVM status, with metrics and probes.
package lockstepd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	virtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/source"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/agent"
	"github.com/lockstep-dev/lockstep/internal/arbiter"
	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/failover"
	ftmember "github.com/lockstep-dev/lockstep/internal/member"
	"github.com/lockstep-dev/lockstep/internal/term"
)

// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachineinstances,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=ft.lockstep.dev,resources=faulttolerantvms,verbs=get
// +kubebuilder:rbac:groups=ft.lockstep.dev,resources=faulttolerantvms/status,verbs=patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch

// Daemon runs an agent for every FT member on its node.
type Daemon struct {
	Config Config
	Client client.Client
	// Records reads and writes the pairs' records (their Leases) past the cache: a claim must
	// see the record as it is.
	Records client.Client
	Node    *Node

	changes chan event.GenericEvent
	ready   chan struct{}

	mu     sync.Mutex
	agents map[types.NamespacedName]*member // by VMI
	// certs is the node's certificate as it is served (its expiry is a metric).
	certs *certFiles
	// reprotection keeps lockstepd unready after a restart until the VMs its node held are
	// protected again.
	reprotection *reprotectionGate
}

// member is a running member and what the daemon remembers of it.
type member struct {
	*Member // Spec.Primary: the role the agent started in
	pair    types.NamespacedName
	// reporting
	reported   agent.Status
	reportedAt time.Time
	rates      rateWindow
	syncMarked bool
	// disksMeasured: the member's disk sizes are on its VMI (AnnotationMeasuredDiskBytes).
	disksMeasured bool
}

// identityOf names a side in the pair's Lease (its record): "<node>/<vmi>"; vmiOf reads the VMI
// back.
func identityOf(node, vmi string) string { return ftv1.SideIdentity(node, vmi) }

func vmiOf(identity string) string { return ftv1.VMIOfIdentity(identity) }

// annotate is a merge patch that sets annotations.
func annotate(annotations map[string]string) client.Patch {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	return client.RawPatch(types.MergePatchType, patch)
}

// LeaseName is the name of a pair's Lease, in the FaultTolerantVM's namespace: the pair's record,
// which the operator reads and writes too.
func LeaseName(ftvm string) string { return ftv1.RecordName(ftvm) }

// SetupWithManager registers the daemon: the FT log listener, the sweeper of gone members'
// directories, the member reconciler, the metrics and the readiness check.
func (d *Daemon) SetupWithManager(mgr ctrl.Manager) error {
	files := &certFiles{cfg: &d.Config}
	d.certs = files
	tc, err := files.tlsConfig()
	if err != nil {
		return fmt.Errorf("loading the node's TLS files: %w", err)
	}
	d.Node.TLS, d.Node.Config = tc, d.Config
	d.changes = make(chan event.GenericEvent, 64)
	d.ready = make(chan struct{})
	d.agents = map[types.NamespacedName]*member{}
	registerMetrics(d)
	if err := mgr.Add(manager.RunnableFunc(d.serve)); err != nil {
		return err
	}
	if err := mgr.Add(&nodeLease{Client: d.Records, Namespace: d.Config.Namespace, Node: d.Config.NodeName, Ready: d.ready,
		Every: ftv1.NodeLeaseRenewSeconds * time.Second}); err != nil {
		return err
	}
	if err := mgr.Add(&dirSweeper{RunDir: d.Config.RunDir, Reader: mgr.GetClient(), Every: 5 * time.Minute, Grace: 10 * time.Minute}); err != nil {
		return err
	}
	d.reprotection = &reprotectionGate{RunDir: d.Config.RunDir, Reader: d.Records, Timeout: d.Config.ReprotectionTimeout, Every: 5 * time.Second}
	if err := d.reprotection.load(time.Now()); err != nil {
		// Readiness then waits for nothing: a rollout goes on as before the ledger.
		mgr.GetLogger().Error(err, "reading the reprotection ledger the last lockstepd on this node left; ignoring it")
	}
	if err := mgr.Add(d.reprotection); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("reprotection", d.reprotection.Check); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ft-log-listener", func(*http.Request) error {
		select {
		case <-d.ready:
			return nil
		default:
			return errors.New("the FT log listener is not up")
		}
	}); err != nil {
		return err
	}
	toPair := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []ctrl.Request {
		p := o.GetLabels()[ftv1.LabelPair]
		if p == "" {
			return nil
		}
		return []ctrl.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: p}}}
	})
	return ctrl.NewControllerManagedBy(mgr).Named("lockstepd").
		WithOptions(controller.Options{RateLimiter: retryLimiter()}).
		Watches(&virtv1.VirtualMachineInstance{}, toPair).
		WatchesRawSource(source.Channel(d.changes, toPair)).
		Complete(d)
}

// retryCap bounds how long lockstepd waits to retry a pair whose reconcile failed. Its writes
// report members' states and delete fenced members, which the operator waits for: after an API
// server outage they must go through soon after it is back, not after controller-runtime's
// default backoff, which doubles up to 1000 s (a primary that claimed through a 27 s outage was
// deleted 40 s after the API server returned). A node holds a few members, so the API server gets
// at most a few retries a second from each lockstepd.
const retryCap = 2 * time.Second

// retryLimiter is controller-runtime's default rate limiter (a per-pair backoff from 5 ms, and
// 10 retries a second overall, bursts of 100) with the backoff capped at retryCap.
func retryLimiter() workqueue.TypedRateLimiter[ctrl.Request] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[ctrl.Request](5*time.Millisecond, retryCap),
		&workqueue.TypedBucketRateLimiter[ctrl.Request]{Limiter: rate.NewLimiter(rate.Limit(10), 100)},
	)
}

// serve listens for FT log connections and streams, and publishes their advertised addresses on
// the Node.
func (d *Daemon) serve(ctx context.Context) error {
	logs, streams, err := d.Node.Listen(ctx)
	if err != nil {
		return err
	}
	if err := d.publishAddresses(ctx); err != nil {
		_ = logs.Close()
		_ = streams.Close()
		return err
	}
	close(d.ready)
	log.FromContext(ctx).Info("serving FT logs and streams", "logs", logs.Addr().String(), "streams", streams.Addr().String(),
		"advertise", d.Config.AdvertiseAddress, "stream-advertise", d.Config.StreamAdvertiseAddress)
	// The listeners serve until lockstepd stops; the pairs they carry are taken down only after
	// the ledger names those that were protected, for the next lockstepd on the node to wait for.
	serving, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServing()
	served := make(chan error, 1)
	go func() { served <- d.Node.Serve(serving, logs, streams) }()
	select {
	case <-ctx.Done():
	case err = <-served:
		served <- err
	}
	if herr := d.reprotection.handOver(d.protectedPairs(), time.Now()); herr != nil {
		log.FromContext(ctx).Error(herr, "writing the reprotection ledger for the next lockstepd on this node")
	}
	stopServing()
	err = <-served
	d.stopAll()
	return err
}

// protectedPairs are the pairs whose member on this node is in a protected pair (a primary
// streaming to its secondary, or a synchronized secondary), with that secondary.
func (d *Daemon) protectedPairs() []ProtectedPair {
	var pairs []ProtectedPair
	for _, m := range d.members() {
		st := m.Agent.Status()
		switch {
		case st.State == failover.Protected:
			pairs = append(pairs, ProtectedPair{Pair: m.pair.String(), Secondary: st.Peer.VMI})
		case st.State == failover.Replicating && st.Synced:
			pairs = append(pairs, ProtectedPair{Pair: m.pair.String(), Secondary: vmiOf(st.Identity)})
		}
	}
	return pairs
}

func (d *Daemon) publishAddresses(ctx context.Context) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: d.Config.NodeName}}
	patch := annotate(map[string]string{
		ftv1.AnnotationNodeLoggingAddress: d.Config.AdvertiseAddress,
		ftv1.AnnotationNodeStreamAddress:  d.Config.StreamAdvertiseAddress,
	})
	for {
		err := d.Client.Patch(ctx, node, patch)
		if err == nil {
			return nil
		}
		log.FromContext(ctx).Error(err, "publishing the logging addresses on the Node; retrying")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// members are the running members, taken from the map under its lock.
func (d *Daemon) members() []*member {
	d.mu.Lock()
	defer d.mu.Unlock()
	ms := make([]*member, 0, len(d.agents))
	for _, m := range d.agents {
		ms = append(ms, m)
	}
	return ms
}

// stopAll stops every agent (lockstepd is stopping) and waits for them.
func (d *Daemon) stopAll() {
	for _, m := range d.members() {
		m.Stop()
	}
}

// Reconcile brings the agents of one pair in line with its members on this node, and reports.
func (d *Daemon) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var vmis virtv1.VirtualMachineInstanceList
	if err := d.Client.List(ctx, &vmis, client.InNamespace(req.Namespace), client.MatchingLabels{ftv1.LabelPair: req.Name}); err != nil {
		return ctrl.Result{}, err
	}
	var errs []error
	local := map[types.NamespacedName]*virtv1.VirtualMachineInstance{}
	keep := map[types.NamespacedName]*virtv1.VirtualMachineInstance{} // local, and fenced: let the fence finish
	errs = append(errs, d.prepareDirs(vmis.Items)...)
	for i := range vmis.Items {
		v := &vmis.Items[i]
		if v.Status.NodeName != d.Config.NodeName {
			continue
		}
		if v.Labels[ftv1.LabelRole] == ftv1.RoleFenced {
			// The operator took the member out of the pair's record: it never runs the VM again.
			key := client.ObjectKeyFromObject(v)
			if m := d.fence(ctx, key, "the operator fenced this member: "+v.Annotations[ftv1.AnnotationFencedMessage]); m != nil {
				errs = append(errs, d.settle(ctx, key, v, m)) // reports Fenced once the agent is
			}
			keep[key] = v
			continue
		}
		if v.Status.Phase == virtv1.Running && v.DeletionTimestamp == nil {
			local[client.ObjectKeyFromObject(v)] = v
			keep[client.ObjectKeyFromObject(v)] = v
		}
	}
	d.stopGone(req.NamespacedName, keep)

	waiting := false
	for key, vmi := range local {
		m, err := d.ensureAgent(ctx, req.NamespacedName, vmi)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if vmi.Labels[ftv1.LabelRole] == ftv1.RolePrimary && !m.Spec.Primary {
			m.Agent.Promote(ctx)
		}
		// A member that runs the VM (a primary, or a secondary that went live) streams to the
		// pair's secondary; a waiting secondary's engine streams to its primary.
		runsVM := m.Spec.Primary || vmi.Labels[ftv1.LabelRole] == ftv1.RolePrimary || m.Agent.Status().RunsVM
		peer, found, err := d.peerOf(ctx, vmi, runsVM, vmis.Items)
		if err != nil {
			errs = append(errs, err)
		}
		if found && peer.Addr == "" {
			waiting = true
		}
		m.SetPeer(ctx, peer)
		errs = append(errs, d.settle(ctx, key, vmi, m))
	}
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, err
	}
	if waiting {
		return ctrl.Result{RequeueAfter: 2 * time.Second}, nil
	}
	if len(local) > 0 {
		return ctrl.Result{RequeueAfter: d.Config.StatusInterval}, nil
	}
	return ctrl.Result{}, nil
}

// prepareDirs makes the directories of the pair's members that placement put on this node, for
// the user their QEMU runs as, as soon as the operator made them: a member's launcher pod mounts
// its directory (a hostPath that must exist), so it starts only once lockstepd made it, and
// KubeVirt names the member's node in its status only once that pod runs.
func (d *Daemon) prepareDirs(vmis []virtv1.VirtualMachineInstance) []error {
	var errs []error
	for i := range vmis {
		v := &vmis[i]
		if v.DeletionTimestamp != nil || v.IsFinal() || v.Labels[ftv1.LabelRole] == ftv1.RoleFenced ||
			(v.Labels[ftv1.LabelNode] != d.Config.NodeName && v.Status.NodeName != d.Config.NodeName) {
			continue
		}
		if err := PrepareMemberDir(d.Config.MemberDir(MemberOf(v, d.Config.NodeName)), d.Config.LauncherOwner(), d.Config.MemberDirLabel); err != nil {
			errs = append(errs, fmt.Errorf("member %s: %w", v.Name, err))
		}
	}
	return errs
}

// fence fences the agent of a member, if it runs one (and returns it); the agent stops its VM for
// good.
func (d *Daemon) fence(ctx context.Context, key types.NamespacedName, why string) *member {
	d.mu.Lock()
	m := d.agents[key]
	d.mu.Unlock()
	if m != nil {
		m.Agent.Fence(ctx, why)
	}
	return m
}

// stopGone stops the agents of the pair whose member left this node (or ended).
func (d *Daemon) stopGone(pair types.NamespacedName, local map[types.NamespacedName]*virtv1.VirtualMachineInstance) {
	d.mu.Lock()
	var gone []*member
	for key, m := range d.agents {
		if m.pair == pair && local[key] == nil {
			gone = append(gone, m)
			delete(d.agents, key)
		}
	}
	d.mu.Unlock()
	for _, m := range gone {
		m.Stop()
	}
}

func (d *Daemon) ensureAgent(ctx context.Context, pair types.NamespacedName, vmi *virtv1.VirtualMachineInstance) (*member, error) {
	key := client.ObjectKeyFromObject(vmi)
	d.mu.Lock()
	m := d.agents[key]
	d.mu.Unlock()
	if m != nil {
		return m, nil
	}
	arb := &arbiter.Arbiter{Client: d.Records, Identity: identityOf(d.Config.NodeName, vmi.Name), Timeout: d.Config.ClaimAttemptTimeout(), Term: term.Term(d.Config.RecordTerm),
		Lease: types.NamespacedName{Namespace: pair.Namespace, Name: LeaseName(pair.Name)}}
	spec := MemberOf(vmi, d.Config.NodeName)
	if !spec.Primary {
		// A secondary that went live while an earlier lockstepd ran holds the record before the
		// operator relabels it: it runs the VM, and starts as the primary it is.
		holder, err := arb.Current(ctx)
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reading the record of %s: %w", pair, err)
		}
		spec.Primary = err == nil && holder.Self
	}
	lg := log.FromContext(ctx).WithValues("vmi", key.String(), "identity", spec.Identity)
	onChange := func() {
		select {
		case d.changes <- event.GenericEvent{Object: vmi.DeepCopy()}:
		default: // a reconcile of the pair is already due
		}
	}
	run, err := d.Node.StartMember(context.WithoutCancel(ctx), spec, arb, lg, onChange)
	if err != nil {
		return nil, err
	}
	m = &member{Member: run, pair: pair}
	go func() {
		if errors.Is(run.Err(), engine.ErrFenced) {
			lg.Info("the member was fenced; its VMI will be deleted", "why", m.Agent.Status().Message)
			onChange()
		}
	}()
	d.mu.Lock()
	d.agents[key] = m
	d.mu.Unlock()
	return m, nil
}

// peerOf finds the other member of self's pair, on another node: a primary's secondary (which
// it streams to), a secondary's primary (which its engine's streams, if any, go to).
func (d *Daemon) peerOf(ctx context.Context, self *virtv1.VirtualMachineInstance, runsVM bool, all []virtv1.VirtualMachineInstance) (agent.Peer, bool, error) {
	want := ftv1.RoleSecondary
	if !runsVM {
		want = ftv1.RolePrimary
	}
	for i := range all {
		v := &all[i]
		if v.Name == self.Name || v.DeletionTimestamp != nil || v.Labels[ftv1.LabelRole] != want ||
			v.Status.NodeName == "" || v.Status.NodeName == d.Config.NodeName || v.Status.Phase != virtv1.Running {
			continue
		}
		p := agent.Peer{VMI: v.Name, Node: v.Status.NodeName}
		if runsVM {
			// The secondary's copies may hold an earlier secondary's replicas (the operator
			// handed them over): the engine then copies only what the VM wrote since.
			p.ReplicaOf = v.Annotations[ftv1.AnnotationReplicaOf]
		}
		node := &corev1.Node{}
		if err := d.Client.Get(ctx, types.NamespacedName{Name: p.Node}, node); err != nil {
			return p, true, client.IgnoreNotFound(err)
		}
		p.Addr = node.Annotations[ftv1.AnnotationNodeLoggingAddress]
		p.StreamAddr = node.Annotations[ftv1.AnnotationNodeStreamAddress]
		return p, true, nil
	}
	return agent.Peer{}, false, nil
}

// settle carries out what the agent's state asks of the API: mark a synchronized secondary,
// delete a fenced member, report.
func (d *Daemon) settle(ctx context.Context, key types.NamespacedName, vmi *virtv1.VirtualMachineInstance, m *member) error {
	st := m.Agent.Status()
	if st.State == failover.Fenced {
		// A fenced member's VM is stopped for good; deleting its VMI lets the operator replace it.
		err := d.Client.Delete(ctx, vmi, client.Preconditions{UID: &vmi.UID})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting fenced member %s: %w", key, err)
		}
	}
	if st.Synced && !m.syncMarked && vmi.Labels[ftv1.LabelRole] == ftv1.RoleSecondary {
		if _, ok := vmi.Annotations[ftv1.AnnotationSyncedAt]; !ok {
			if err := d.Client.Patch(ctx, vmi, annotate(map[string]string{ftv1.AnnotationSyncedAt: time.Now().UTC().Format(time.RFC3339)})); err != nil {
				return fmt.Errorf("marking %s synchronized: %w", key, err)
			}
		}
		m.syncMarked = true
	}
	if st.RunsVM && len(st.DiskBytes) > 0 && !m.disksMeasured {
		// Not in the way of the report: without the sizes, only a new secondary waits.
		if err := d.publishDiskBytes(ctx, vmi, st.DiskBytes); err != nil {
			log.FromContext(ctx).Error(err, "publishing the sizes of the member's disks; retrying", "vmi", key.String())
		} else {
			m.disksMeasured = true
		}
	}
	return d.report(ctx, m, st)
}

// publishDiskBytes puts the sizes of the VM's replicated disks, as the engine measured them, on
// the member that runs it: the operator makes the next secondary's images exactly as large.
func (d *Daemon) publishDiskBytes(ctx context.Context, vmi *virtv1.VirtualMachineInstance, sizes []int64) error {
	names, _ := ftmember.ReplicatedDisksOf(vmi) // none: the count below says so
	if len(names) != len(sizes) {
		return fmt.Errorf("its QEMU has %d replicated disks, its VMI names %d (%v)", len(sizes), len(names), names)
	}
	b := ftmember.DiskBytes{}
	for i, n := range names {
		b[n] = sizes[i]
	}
	if vmi.Annotations[ftv1.AnnotationMeasuredDiskBytes] == b.String() {
		return nil
	}
	return client.IgnoreNotFound(d.Client.Patch(ctx, vmi, annotate(map[string]string{ftv1.AnnotationMeasuredDiskBytes: b.String()})))
}

// report writes the agent's side into the FaultTolerantVM's status: at once when the state
// changed, otherwise at most every StatusInterval.
func (d *Daemon) report(ctx context.Context, m *member, st agent.Status) error {
	now := time.Now()
	prev := m.reported
	changed := prev.State != st.State || prev.Synced != st.Synced || prev.Connected != st.Connected || prev.Epoch != st.Epoch
	if !changed && now.Sub(m.reportedAt) < d.Config.StatusInterval {
		return nil
	}
	side := ftv1.SideStatus{
		VMI: vmiOf(st.Identity), Node: d.Config.NodeName, State: ftv1.SideState(st.State.String()),
		Since: &metav1.Time{Time: st.Since}, Epoch: int64(st.Epoch), Synchronized: st.Synced,
		Connected: st.Connected, HeldOutputs: int32(st.Held), Message: st.Message,
		ReportTime: metav1.NewTime(now),
	}
	if !st.LastHeard.IsZero() {
		side.LastHeartbeatTime = &metav1.Time{Time: st.LastHeard}
	}
	sp, err := sidePatch(side)
	if err != nil {
		return err
	}
	status := map[string]any{}
	if st.RunsVM || m.Spec.Primary {
		repl := map[string]any{"primary": sp}
		if !m.Spec.Primary && !prev.RunsVM {
			repl["secondary"] = nil // this side's report as the secondary it no longer is
		}
		status["replication"] = repl
		if st.Interval > 0 {
			status["vLockstepInterval"] = metav1.Duration{Duration: st.Interval}
		}
		status["resync"] = resyncStatus(st.Resync, now)
		status["lastResync"] = lastResyncStatus(st.LastResync)
		var fields map[string]any
		fields, m.rates = logRates(m.rates, st, now, d.Config.StatusInterval)
		for k, v := range fields {
			status[k] = v
		}
	} else {
		status["replication"] = map[string]any{"secondary": sp}
	}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	ftvm := &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Namespace: m.pair.Namespace, Name: m.pair.Name}}
	if err := d.Client.Status().Patch(ctx, ftvm, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return client.IgnoreNotFound(err)
	}
	m.reported, m.reportedAt = st, now
	return nil
}

// Statuses returns every agent's snapshot (for the metrics).
func (d *Daemon) Statuses() []agent.Status {
	ms := d.members()
	out := make([]agent.Status, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.Agent.Status())
	}
	return out
}

// resyncStatus is the status of a resync that runs (nil, which the merge patch removes, when
// none does): what is copied of what there is, the mean rate since it began, and when it will
// have caught up at that rate.
func resyncStatus(r engine.Resync, now time.Time) *ftv1.ResyncStatus {
	if r.Started.IsZero() {
		return nil
	}
	rs := &ftv1.ResyncStatus{StartTime: &metav1.Time{Time: r.Started}, DoneBytes: ptr.To(int64(r.Done)), TotalBytes: ptr.To(int64(r.Total))}
	if elapsed := now.Sub(r.Started).Seconds(); elapsed > 0 && r.Done > 0 {
		rate := float64(r.Done) / elapsed
		rs.BytesPerSecond = resource.NewQuantity(int64(rate), resource.DecimalSI)
		left := time.Duration(float64(r.Total-min(r.Done, r.Total)) / rate * float64(time.Second))
		rs.EstimatedCompletionTime = &metav1.Time{Time: now.Add(left).Truncate(time.Second)}
	}
	return rs
}

// lastResyncStatus is the status of the engine's last completed resync (nil before its first).
func lastResyncStatus(r engine.ResyncDone) *ftv1.LastResyncStatus {
	if r.Member == "" {
		return nil
	}
	return &ftv1.LastResyncStatus{Secondary: r.Member, Incremental: ptr.To(r.Incremental), CopiedBytes: ptr.To(int64(r.Bytes)),
		DurationMilliseconds: ptr.To(r.Took.Round(time.Millisecond).Milliseconds()), CompletionTime: &metav1.Time{Time: r.At.Truncate(time.Second)}}
}

// rateWindow is where a side's reported rates are measured from: its status at the window's
// start.
type rateWindow struct {
	at   time.Time
	from agent.Status
}

// logRates is what a report of a side that runs the VM says of its log: the bandwidth and the
// checkpoints a second over a window of at least every, and the checkpoints' mean pause. A window
// starts at the side's first report and again whenever its state changes, so that a figure never
// mixes two states (a primary's initial copy is not its protected bandwidth): such a report
// clears the rates, and they stay absent until a whole window of the new state is measured.
// Reports in between leave the last rates as they are. The fields are a merge patch of the
// status; the window is the one to measure from next.
func logRates(w rateWindow, st agent.Status, now time.Time, every time.Duration) (map[string]any, rateWindow) {
	fields := map[string]any{}
	var cps map[string]any
	if st.Checkpoints > 0 {
		cps = map[string]any{"pauseMilliseconds": int32(st.CheckpointPause.Milliseconds())}
		fields["checkpoints"] = cps
	}
	restart := w.at.IsZero() || w.from.State != st.State || st.BytesLogged < w.from.BytesLogged ||
		st.Checkpoints < w.from.Checkpoints || st.ForcedCheckpoints < w.from.ForcedCheckpoints ||
		st.CheckpointsOnMismatch < w.from.CheckpointsOnMismatch || st.CheckpointsOnTimeout < w.from.CheckpointsOnTimeout ||
		st.CheckpointsOnUnparsed < w.from.CheckpointsOnUnparsed || st.CheckpointsOnCrossed < w.from.CheckpointsOnCrossed
	elapsed := now.Sub(w.at)
	switch {
	case restart:
		fields["logBandwidth"] = nil
		if cps != nil {
			cps["perSecond"], cps["forcedPerSecond"], cps["mismatchPerSecond"], cps["timeoutPerSecond"], cps["unparsedPerSecond"], cps["crossedPerSecond"] = nil, nil, nil, nil, nil, nil
		}
		return fields, rateWindow{at: now, from: st}
	case elapsed < every || elapsed <= 0:
		return fields, w
	}
	perSecond := func(n uint64) *resource.Quantity {
		return resource.NewMilliQuantity(int64(float64(n)*1000/elapsed.Seconds()), resource.DecimalSI)
	}
	fields["logBandwidth"] = resource.NewQuantity(int64(float64(st.BytesLogged-w.from.BytesLogged)/elapsed.Seconds()), resource.DecimalSI)
	if cps != nil {
		cps["perSecond"] = perSecond(st.Checkpoints - w.from.Checkpoints)
		cps["forcedPerSecond"] = perSecond(st.ForcedCheckpoints - w.from.ForcedCheckpoints)
		if st.CheckpointCausesKnown && w.from.CheckpointCausesKnown {
			cps["mismatchPerSecond"] = perSecond(st.CheckpointsOnMismatch - w.from.CheckpointsOnMismatch)
			cps["timeoutPerSecond"] = perSecond(st.CheckpointsOnTimeout - w.from.CheckpointsOnTimeout)
			cps["unparsedPerSecond"] = perSecond(st.CheckpointsOnUnparsed - w.from.CheckpointsOnUnparsed)
			cps["crossedPerSecond"] = perSecond(st.CheckpointsOnCrossed - w.from.CheckpointsOnCrossed)
		} else {
			cps["mismatchPerSecond"], cps["timeoutPerSecond"], cps["unparsedPerSecond"], cps["crossedPerSecond"] = nil, nil, nil, nil
		}
	}
	return fields, rateWindow{at: now, from: st}
}
