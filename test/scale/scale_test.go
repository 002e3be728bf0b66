//go:build scale

package scale

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/member"
	"github.com/lockstep-dev/lockstep/test/localcluster"
)

// The operator's defaults (--max-ft-vms-per-node, --max-ft-vcpus-per-node), and what the scale
// cluster runs it with.
const (
	defaultMaxMembers = 4
	defaultMaxVCPUs   = 8
	nodeLostGrace     = 10 * time.Second
	metricsAddr       = "127.0.0.1:18443"
	pprofAddr         = "127.0.0.1:18444"
	namespace         = "scale"
	// converge bounds each phase: generous, as the figures are reported, not asserted.
	converge = 15 * time.Minute
)

// size is what a run makes: SCALE_NODES nodes (default 50), SCALE_FTVMS FaultTolerantVMs (200),
// then SCALE_EXTRA more (40), and a tenth of the nodes killed at once.
type size struct{ nodes, ftvms, extra int }

func sizeFromEnv() size {
	get := func(key string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(key)); err == nil && v > 0 {
			return v
		}
		return def
	}
	return size{nodes: get("SCALE_NODES", 50), ftvms: get("SCALE_FTVMS", 200), extra: get("SCALE_EXTRA", 40)}
}

// nodeShape is a node's per-node FT limit overrides, by its number: one node in five is big (8
// members, 12 vCPUs), one in ten small (2 members); the rest keep the defaults (4 and 8).
func nodeShape(i int) map[string]string {
	switch i % 10 {
	case 0, 5:
		return map[string]string{ftv1.AnnotationNodeMaxVMs: "8", ftv1.AnnotationNodeMaxVCPUs: "12"}
	case 7:
		return map[string]string{ftv1.AnnotationNodeMaxVMs: "2"}
	}
	return nil
}

// vcpusOfVM is the size of the i-th FaultTolerantVM: of each hundred, 60 have 1 vCPU, 28 have
// 2, 10 have 4 and 2 have 8.
func vcpusOfVM(i int) int {
	switch r := (i * 37) % 100; { // spread the sizes over the order of creation
	case r < 60:
		return 1
	case r < 88:
		return 2
	case r < 98:
		return 4
	default:
		return 8
	}
}

func TestScale(t *testing.T) {
	sz := sizeFromEnv()
	// SCALE_OPERATOR_ARGS: more operator flags, to compare settings (--max-concurrent-reconciles=8).
	env := []string{"NODE_LOST_GRACE=" + nodeLostGrace.String(),
		"OPERATOR_ARGS=--metrics-bind-address " + metricsAddr + " --metrics-secure=false --pprof-bind-address " + pprofAddr +
			" " + os.Getenv("SCALE_OPERATOR_ARGS")}
	if cfg := os.Getenv("KWOKCTL_CONFIG"); cfg != "" {
		env = append(env, "KWOKCTL_CONFIG="+cfg)
	}
	lc := localcluster.New("lockstep-scale", "SCALE_KEEP", env...)
	figures := &localcluster.Figures{Title: fmt.Sprintf("Scale figures: %d FaultTolerantVMs (then %d more) on %d nodes; node-lost grace %s",
		sz.ftvms, sz.extra, sz.nodes, nodeLostGrace)}
	if args := os.Getenv("SCALE_OPERATOR_ARGS"); args != "" {
		figures.Title += "; operator " + args
	}
	t.Logf("bringing up the cluster with %d nodes", sz.nodes)
	upAt := time.Now()
	if err := lc.Up(sz.nodes); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		t.Log(figures.String())
		if t.Failed() {
			for name, tail := range lc.Logs(40) {
				t.Logf("%s (tail):\n%s", name, tail)
			}
		}
		msg, err := lc.End()
		if msg != "" {
			t.Log(msg)
		}
		if err != nil {
			t.Error(err)
		}
	})
	figures.Add("cluster up (kwokctl, nodes, install, operator)", time.Since(upAt))
	k8s, err := lc.Client(500, 1000)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := lc.Kubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ctrllog.SetLogger(logr.Discard()) // the monitor's cache logs nothing a reader of the run needs

	shapeNodes(ctx, t, k8s, sz.nodes)
	mon, err := startMonitor(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// kwok readies 4 or 5 nodes a second here
	waitFor(t, "every node Ready", 10*time.Minute, func() (bool, string) {
		open := 0
		for _, r := range mon.rooms() {
			if r.Open {
				open++
			}
		}
		return open == sz.nodes, fmt.Sprintf("%d of %d nodes Ready", open, sz.nodes)
	})
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(ctx, localcluster.LoggingNetwork(namespace)); err != nil {
		t.Fatal(err)
	}
	operatorPID, err := lc.PID("operator")
	if err != nil {
		t.Fatal(err)
	}
	operator := func() usage {
		u, err := usageOf(operatorPID)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	metrics := func() samples {
		s, err := scrape("http://" + metricsAddr + "/metrics")
		if err != nil {
			t.Fatalf("the operator's metrics: %v", err)
		}
		return s
	}
	start := metrics()
	cpu0 := operator().cpu
	anon := sampleAnon(operatorPID)

	// Phase 1: the FaultTolerantVMs, all at once.
	mon.setPhase("apply")
	applied := time.Now()
	firstProtected := make(chan time.Time, 1)
	go watchFirstProtected(ctx, k8s, firstProtected)
	profiled := profileCPU(ctx, t, "apply")
	createFTVMs(ctx, t, k8s, 0, sz.ftvms)
	figures.Add(fmt.Sprintf("apply of %d FaultTolerantVMs (16 clients)", sz.ftvms), time.Since(applied))
	st := waitConverged(t, mon, sz.ftvms)
	figures.Add(fmt.Sprintf("apply → every placeable VM Protected (%s)", st), time.Since(applied))
	select {
	case at := <-firstProtected:
		figures.Add("apply → the first Protected", at.Sub(applied))
	default:
	}
	afterApply := metrics()
	profiled()

	// Phase 2: more than the cluster can hold. What they cost while they wait is what the
	// operator does for them once everything has settled.
	mon.setPhase("extra")
	extraAt := time.Now()
	createFTVMs(ctx, t, k8s, sz.ftvms, sz.ftvms+sz.extra)
	st = waitConverged(t, mon, sz.ftvms+sz.extra)
	figures.Add(fmt.Sprintf("%d more → settled (%s)", sz.extra, st), time.Since(extraAt))
	idle0, idleAt := metrics(), time.Now()
	time.Sleep(30 * time.Second)
	idle1 := metrics()
	perMinute := func(name string, with ...string) float64 {
		return (idle1.sum(name, with...) - idle0.sum(name, with...)) / time.Since(idleAt).Minutes()
	}
	figures.AddText(fmt.Sprintf("while %d VMs wait, a minute costs", st.waiting),
		fmt.Sprintf("%.0f reconciles, %.0f API requests", perMinute("controller_runtime_reconcile_total", `controller="faulttolerantvm"`),
			perMinute("rest_client_requests_total")))

	// Phase 3: the extra VMs are deleted again. A cluster keeps room for failures: with every
	// slot taken, as it is now, no VM that loses a member could be protected again.
	mon.setPhase("delete")
	deleteAt := time.Now()
	parallel(t, sz.ftvms, sz.ftvms+sz.extra, func(i int) error { return client.IgnoreNotFound(k8s.Delete(ctx, ftvm(i))) })
	st = waitConverged(t, mon, sz.ftvms)
	figures.Add(fmt.Sprintf("the %d more deleted → gone, the rest settled (%s)", sz.extra, st), time.Since(deleteAt))

	// Phase 4: a tenth of the nodes die at once.
	mon.setPhase("kill")
	var victims []string
	for i := 1; i <= sz.nodes; i++ {
		if i%10 == 3 { // every shape of node: one in ten, none of them the small ones
			victims = append(victims, fmt.Sprintf("node-%d", i))
		}
	}
	affected := membersOn(t, mon, victims)
	killed := time.Now()
	if _, err := lc.Run(append([]string{"kill-node"}, victims...)...); err != nil {
		t.Fatal(err)
	}
	var gone time.Time
	lastKill := killed
	waitFor(t, "the killed nodes seen gone", 3*time.Minute, func() (bool, string) {
		var ready []string
		for _, v := range victims {
			if mon.open(v) {
				ready = append(ready, v)
			}
		}
		// kwok once kept heartbeating one node of five killed at once for minutes (its Lease
		// taken, the node Ready): a node still Ready well past the node lifecycle's grace is
		// killed again, and the run says so.
		if len(ready) > 0 && time.Since(lastKill) > 90*time.Second {
			t.Logf("killing %v again: still Ready %s after their kill", ready, time.Since(lastKill).Round(time.Second))
			if _, err := lc.Run(append([]string{"kill-node"}, ready...)...); err != nil {
				t.Fatal(err)
			}
			lastKill = time.Now()
		}
		if len(ready) > 0 {
			var l coordinationv1.Lease
			holder := "?"
			if k8s.Get(ctx, client.ObjectKey{Namespace: "kube-node-lease", Name: ready[0]}, &l) == nil && l.Spec.HolderIdentity != nil {
				holder = *l.Spec.HolderIdentity
			}
			return false, fmt.Sprintf("%v still Ready (the Lease of %s held by %s)", ready, ready[0], holder)
		}
		// The moment the last of them was seen to stop, through the monitor's watch: lockstep's
		// grace for it runs from there.
		for _, v := range victims {
			if at := mon.closedSince(v); at.After(gone) {
				gone = at
			}
		}
		return true, ""
	})
	st = waitConverged(t, mon, sz.ftvms)
	done := time.Now()
	// lockstep's grace runs from each node's Ready condition's transition, as the operator reads it.
	var graceOut time.Time
	for _, v := range victims {
		if g := mon.notReadySince(v).Add(nodeLostGrace); g.After(graceOut) {
			graceOut = g
		}
	}
	figures.Add(fmt.Sprintf("%d nodes killed → the node lifecycle sees them gone", len(victims)), gone.Sub(killed))
	figures.Add(fmt.Sprintf("%d nodes killed → every VM that can be Protected again (%s)", len(victims), st), done.Sub(killed))
	figures.Add("lockstep's grace over → every VM that can be Protected again", done.Sub(graceOut))
	figures.AddText("each VM that lost a member: its node's grace over → Protected again", reprotection(mon, affected))

	end := metrics()
	u := operator()
	u.peakAnon = anon.Peak()
	figures.AddText("the operator", fmt.Sprintf("%s (%.1f in the run)", u, (u.cpu-cpu0).Seconds()))
	if pid, err := lc.PID("kube-apiserver"); err == nil {
		if au, err := usageOf(pid); err == nil {
			figures.AddText("kube-apiserver", au.String())
		}
	}
	with := `controller="faulttolerantvm"`
	figures.AddText("reconcile latency, apply", fmt.Sprintf("p50 %s, p99 %s",
		quantile(0.5, "controller_runtime_reconcile_time_seconds", start, afterApply, with).Round(time.Millisecond),
		quantile(0.99, "controller_runtime_reconcile_time_seconds", start, afterApply, with).Round(time.Millisecond)))
	figures.AddText("reconcile latency, whole run", fmt.Sprintf("p50 %s, p99 %s",
		quantile(0.5, "controller_runtime_reconcile_time_seconds", start, end, with).Round(time.Millisecond),
		quantile(0.99, "controller_runtime_reconcile_time_seconds", start, end, with).Round(time.Millisecond)))
	figures.AddText("API requests, apply", fmt.Sprintf("p50 %s, p99 %s; %.0f s waited for the client's rate limit in all, p99 %s",
		quantile(0.5, "rest_client_request_duration_seconds", start, afterApply).Round(time.Millisecond),
		quantile(0.99, "rest_client_request_duration_seconds", start, afterApply).Round(time.Millisecond),
		afterApply.sum("rest_client_rate_limiter_duration_seconds_sum")-start.sum("rest_client_rate_limiter_duration_seconds_sum"),
		quantile(0.99, "rest_client_rate_limiter_duration_seconds", start, afterApply).Round(time.Millisecond)))
	figures.AddText("API requests to Protected, by method and code", byLabels(start, afterApply, "rest_client_requests_total", "method", "code"))
	figures.AddText("API requests per FaultTolerantVM", fmt.Sprintf("%.1f to Protected, %.1f in the whole run",
		(afterApply.sum("rest_client_requests_total")-start.sum("rest_client_requests_total"))/float64(sz.ftvms),
		(end.sum("rest_client_requests_total")-start.sum("rest_client_requests_total"))/float64(sz.ftvms+sz.extra)))
	if v := mon.violations(); len(v) > 0 {
		t.Fatalf("%d broken invariants:\n%s", len(v), strings.Join(v, "\n"))
	}
}

// shapeNodes gives nodes their per-node limits (nodeShape).
func shapeNodes(ctx context.Context, t *testing.T, k8s client.Client, nodes int) {
	parallel(t, 1, nodes+1, func(i int) error {
		shape := nodeShape(i)
		if shape == nil {
			return nil
		}
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i)}}
		patch := client.MergeFrom(n.DeepCopy())
		n.Annotations = shape
		return k8s.Patch(ctx, n, patch)
	})
}

func createFTVMs(ctx context.Context, t *testing.T, k8s client.Client, from, to int) {
	parallel(t, from, to, func(i int) error { return k8s.Create(ctx, ftvm(i)) })
}

// parallel runs do for each of [from, to) on 16 workers and fails the test on the first error.
func parallel(t *testing.T, from, to int, do func(i int) error) {
	t.Helper()
	work := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := do(i); err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("%d: %w", i, err)
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := from; i < to; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	if first != nil {
		t.Fatal(first)
	}
}

func ftvm(i int) *ftv1.FaultTolerantVM {
	vcpus := vcpusOfVM(i)
	mem := resource.MustParse(fmt.Sprintf("%dGi", vcpus))
	return &ftv1.FaultTolerantVM{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("vm-%04d", i)},
		Spec: ftv1.FaultTolerantVMSpec{
			RunStrategy:    ftv1.RunStrategyRunning,
			LoggingNetwork: ftv1.LoggingNetwork{Name: "ft-logging"},
			Template: ftv1.VMITemplate{Spec: virtv1.VirtualMachineInstanceSpec{Domain: virtv1.DomainSpec{
				CPU:    &virtv1.CPU{Cores: uint32(vcpus)},
				Memory: &virtv1.Memory{Guest: &mem},
			}}},
		},
	}
}

// settled is how the FaultTolerantVMs stand once a phase has settled.
type settled struct{ protected, waiting int }

func (s settled) String() string {
	return fmt.Sprintf("%d Protected, %d waiting with no room", s.protected, s.waiting)
}

// waitConverged waits until each of the want FaultTolerantVMs is Protected, or NotProtected with
// no room for what it lacks anywhere in the cluster (roomFor): the operator leaves nothing
// waiting that fits. A VM NotProtected for another reason than a missing node fails the test.
func waitConverged(t *testing.T, mon *monitor, want int) settled {
	t.Helper()
	var st settled
	// The monitor's cache, polled often: the moment the run settles is a figure.
	waitForEvery(t, "every VM Protected, or waiting with no room", converge, 200*time.Millisecond, func() (bool, string) {
		var list ftv1.FaultTolerantVMList
		if err := mon.cache.List(context.Background(), &list, client.InNamespace(namespace)); err != nil {
			return false, err.Error()
		}
		if len(list.Items) != want {
			return false, fmt.Sprintf("%d FaultTolerantVMs, want %d", len(list.Items), want)
		}
		rooms := mon.rooms()
		open := map[string]bool{}
		for _, r := range rooms {
			open[r.Name] = r.Open
		}
		st = settled{}
		states := map[ftv1.FTState]int{}
		var unsettled []string
		for _, f := range list.Items {
			states[f.Status.State]++
			if lost := onClosedNode(f.Status, open); lost != "" {
				unsettled = append(unsettled, fmt.Sprintf("%s %s with %s", f.Name, f.Status.State, lost))
				continue
			}
			switch f.Status.State {
			case ftv1.StateProtected:
				st.protected++
				continue
			case ftv1.StateNotProtected:
			default:
				unsettled = append(unsettled, fmt.Sprintf("%s %s", f.Name, f.Status.State))
				continue
			}
			c := apimeta.FindStatusCondition(f.Status.Conditions, ftv1.ConditionProtected)
			if c == nil || c.Reason != ftv1.ReasonNoEligibleNode {
				unsettled = append(unsettled, fmt.Sprintf("%s NotProtected: %v", f.Name, c))
				continue
			}
			w := waitingVM{Name: f.Name, VCPUs: member.VCPUs(&f.Spec.Template.Spec)}
			if p := f.Status.Primary; p != nil {
				w.PrimaryNode = p.Node
			}
			if room := roomFor(w, rooms); room != "" {
				unsettled = append(unsettled, fmt.Sprintf("%s waits, but %s", f.Name, room))
				continue
			}
			st.waiting++
		}
		if len(unsettled) > 0 {
			sort.Strings(unsettled)
			return false, fmt.Sprintf("%v; %d unsettled, e.g. %s", states, len(unsettled), strings.Join(unsettled[:min(3, len(unsettled))], "; "))
		}
		return true, ""
	})
	return st
}

// membersOn maps each FaultTolerantVM with a member on one of nodes to those nodes.
func membersOn(t *testing.T, mon *monitor, nodes []string) map[string][]string {
	t.Helper()
	on := map[string]bool{}
	for _, n := range nodes {
		on[n] = true
	}
	var list ftv1.FaultTolerantVMList
	if err := mon.cache.List(context.Background(), &list, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, f := range list.Items {
		for _, m := range []*ftv1.MemberStatus{f.Status.Primary, f.Status.Secondary} {
			if m != nil && on[m.Node] {
				out[f.Namespace+"/"+f.Name] = append(out[f.Namespace+"/"+f.Name], m.Node)
			}
		}
	}
	return out
}

// reprotection is, for each VM that lost a member on a node, the time from the operator's grace
// for that node running out (its Ready condition's transition plus --node-lost-grace, as the
// operator reckons it) to the VM Protected again, as the monitor's watch saw it: p50, p99 and the
// most, over the VMs that are Protected again.
func reprotection(mon *monitor, affected map[string][]string) string {
	var took []time.Duration
	for key, nodes := range affected {
		at := mon.lastProtected(key)
		if at.IsZero() {
			continue // waiting with no room
		}
		var graceOut time.Time
		for _, n := range nodes {
			down := mon.notReadySince(n)
			if down.IsZero() {
				down = mon.closedSince(n)
			}
			if g := down.Add(nodeLostGrace); g.After(graceOut) {
				graceOut = g
			}
		}
		took = append(took, at.Sub(graceOut))
	}
	if len(took) == 0 {
		return fmt.Sprintf("none of %d Protected again", len(affected))
	}
	slices.Sort(took)
	at := func(q float64) time.Duration { return took[int(q*float64(len(took)-1))].Round(time.Millisecond) }
	return fmt.Sprintf("p50 %s, p99 %s, most %s (%d VMs; %d waiting with no room)",
		at(0.5), at(0.99), took[len(took)-1].Round(time.Millisecond), len(took), len(affected)-len(took))
}

// onClosedNode names a member of the VM on a node that takes no members (a node that died): the
// VM has not settled until the operator has replaced it.
func onClosedNode(st ftv1.FaultTolerantVMStatus, open map[string]bool) string {
	for role, m := range map[string]*ftv1.MemberStatus{"primary": st.Primary, "secondary": st.Secondary} {
		if m != nil && m.Node != "" && !open[m.Node] {
			return fmt.Sprintf("its %s on %s", role, m.Node)
		}
	}
	return ""
}

// waitFor polls ok every 2 s until it holds, and fails the test with its last word after within.
func waitFor(t *testing.T, what string, within time.Duration, ok func() (bool, string)) {
	t.Helper()
	waitForEvery(t, what, within, 2*time.Second, ok)
}

// waitForEvery polls ok every interval until it holds, logging its word when it changes (at most
// every 2 s), and fails the test with its last word after within.
func waitForEvery(t *testing.T, what string, within, interval time.Duration, ok func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	last, loggedAt := "", time.Time{}
	for {
		done, why := ok()
		if done {
			return
		}
		if why != last && time.Since(loggedAt) >= 2*time.Second {
			t.Logf("waiting for %s: %s", what, why)
			last, loggedAt = why, time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %s", what, within, why)
		}
		time.Sleep(interval)
	}
}

// watchFirstProtected sends the moment the first FaultTolerantVM shows Protected.
func watchFirstProtected(ctx context.Context, k8s client.WithWatch, at chan<- time.Time) {
	w, err := k8s.Watch(ctx, &ftv1.FaultTolerantVMList{}, client.InNamespace(namespace))
	if err != nil {
		return
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if f, ok := ev.Object.(*ftv1.FaultTolerantVM); ok && f.Status.State == ftv1.StateProtected {
			at <- time.Now()
			return
		}
	}
}
