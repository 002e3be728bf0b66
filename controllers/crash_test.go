package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/controllers"
	"github.com/lockstep-dev/lockstep/test/kubevirtdouble"
)

// Crash points. Each path that changes a member's role (a failover, a re-protection, a restart
// from disk, a deletion)
// is run once to record the operator's API writes, which must be exactly the rows of its table;
// then once per row, with the operator "crashing" right after that write: the write goes
// through, every later one fails, the manager is stopped, and a new one starts with an empty
// cache. Each run must end in the same place. A new write in a path fails the first check until
// it has a row, and so a crash test.
//
// A run of status writes counts as one row (the first of them): status is derived, and the next
// reconcile writes it again from what it observes.

// crashSwitch is the test hook in the operator's client.
type crashSwitch struct {
	scheme *runtime.Scheme
	ns     string

	// optional are writes that a run may make or not, by what its cache showed: let through,
	// never counted as rows nor crashed after.
	optional []string

	mu         sync.Mutex
	writes     []string
	crashAfter int // 0: never
	dead       bool
	crashed    chan struct{}
}

func newCrashSwitch(ns string, crashAfter int) *crashSwitch {
	return &crashSwitch{scheme: controllers.NewScheme(), ns: ns, crashAfter: crashAfter, crashed: make(chan struct{})}
}

var errCrashed = fmt.Errorf("the operator crashed (test hook)")

// write lets a write through (or fails it, once crashed) and records it.
func (c *crashSwitch) write(obj client.Object, verb, sub string, do func() error) error {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return errCrashed
	}
	c.mu.Unlock()
	err := do()
	if err != nil || obj.GetNamespace() != c.ns {
		return err
	}
	gvk, _ := apiutil.GVKForObject(obj, c.scheme)
	what := fmt.Sprintf("%s %s %s", verb, gvk.Kind, obj.GetName())
	if sub != "" {
		what += "/" + sub
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if strings.HasSuffix(what, "/status") && len(c.writes) > 0 && c.writes[len(c.writes)-1] == what {
		return nil // a run of status writes is one row
	}
	if slices.Contains(c.optional, what) {
		return nil
	}
	c.writes = append(c.writes, what)
	if len(c.writes) == c.crashAfter {
		c.dead = true
		close(c.crashed)
	}
	return nil
}

func (c *crashSwitch) recorded() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.writes...)
}

// start starts an operator whose client goes through the switch.
func (c *crashSwitch) start(configure ...func(*controllers.Config)) *operatorProcess {
	return startOperatorWith(func(config *rest.Config, options client.Options) (client.Client, error) {
		inner, err := client.NewWithWatch(config, options)
		if err != nil {
			return nil, err
		}
		return interceptor.NewClient(inner, interceptor.Funcs{
			Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				return c.write(obj, "create", "", func() error { return cl.Create(ctx, obj, opts...) })
			},
			Update: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
				return c.write(obj, "update", "", func() error { return cl.Update(ctx, obj, opts...) })
			},
			Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
				return c.write(obj, "patch", "", func() error { return cl.Patch(ctx, obj, patch, opts...) })
			},
			Delete: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
				return c.write(obj, "delete", "", func() error { return cl.Delete(ctx, obj, opts...) })
			},
			SubResourcePatch: func(ctx context.Context, cl client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
				return c.write(obj, "patch", sub, func() error { return cl.SubResource(sub).Patch(ctx, obj, patch, opts...) })
			},
			SubResourceUpdate: func(ctx context.Context, cl client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
				return c.write(obj, "update", sub, func() error { return cl.SubResource(sub).Update(ctx, obj, opts...) })
			},
		}), nil
	}, configure...)
}

// status names a status write in a table row.
func status(kind, name string) string { return "patch " + kind + " " + name + "/status" }

// crashPath is one path of the operator and the table of its writes.
type crashPath struct {
	// setup makes the pair, Protected, and returns what the check needs to know of it.
	setup func(ns string) pairBefore
	// trigger starts the path.
	trigger func(ns string, before pairBefore)
	// check waits for the end state of the path, after however many crashes.
	check func(ns string, before pairBefore)
	rows  []string
	// configure, when set, configures every operator of the path (as its flags would).
	configure func(*controllers.Config)
	// crashRows, when set, are the rows (1-based) after which the operator is crashed: for a path
	// whose later writes are another path's, crash-tested row by row there. All rows are still
	// checked against the path's writes.
	crashRows []int
	// prefix: the rows are the path's first writes; the writes after them are another path's,
	// which tests them row by row (and their order, which here depends on timing).
	prefix bool
	// optional are writes the path may make or not, by what the operator's cache showed when it
	// looked (see crashSwitch.optional).
	optional []string
	// uncrashed, when set, checks more after the run without a crash: what a crashed operator may
	// rightly never have done, such as sending the events it had recorded.
	uncrashed func(ns string, before pairBefore)
	// launcherPods gives the path's VMIs KubeVirt's finalizer and launcher pods
	// (kubevirtdouble.LauncherPods): a deleted member then stays until its pod is gone.
	launcherPods bool
}

// pairBefore is the pair before the path.
type pairBefore struct {
	primary, secondary ftv1.MemberStatus
}

// runCrashPath runs the path once per row, crashing the operator after that row's write.
func runCrashPath(path crashPath) {
	// The suite's operator steps aside: each run has operators of its own.
	operator.stop()
	DeferCleanup(func() { operator = startOperator() })

	var configure []func(*controllers.Config)
	if path.configure != nil {
		configure = append(configure, path.configure)
	}
	run := func(crashAfter int) []string {
		ns := newNamespace()
		if path.launcherPods {
			withLauncherPods(ns)
		}
		sw := newCrashSwitch(ns, 0)
		sw.optional = path.optional
		op := sw.start(configure...)
		before := path.setup(ns)
		// Quiet: nothing left to write before the path starts.
		Eventually(func() bool {
			n := len(sw.recorded())
			time.Sleep(time.Second)
			return len(sw.recorded()) == n
		}, timeout, interval).Should(BeTrue())
		sw.mu.Lock()
		sw.writes, sw.crashAfter = nil, crashAfter
		sw.mu.Unlock()
		monitor := watchPrimaries(ns)
		path.trigger(ns, before)
		if crashAfter > 0 {
			Eventually(sw.crashed, timeout).Should(BeClosed(), "the path made only these writes: %v", sw.recorded())
			op.stop()
			op = startOperatorWith(nil, configure...) // a new process: an empty cache, nothing remembered
		}
		path.check(ns, before)
		if crashAfter == 0 && path.uncrashed != nil {
			path.uncrashed(ns, before)
		}
		writes := sw.recorded()
		monitor.stop()
		Expect(monitor.violations()).To(BeEmpty(), "crash after write %d", crashAfter)
		deleteAllFTVMs(ns)
		op.stop()
		deleteAllNodes()
		expectNothingLeft()
		return writes
	}

	By("recording the path's writes")
	writes := run(0)
	if path.prefix && len(writes) > len(path.rows) {
		writes = writes[:len(path.rows)]
	}
	Expect(writes).To(Equal(path.rows), "the path's writes changed: give each new write a row (and a crash test)")
	for i, row := range path.rows {
		if path.crashRows != nil && !slices.Contains(path.crashRows, i+1) {
			continue
		}
		By(fmt.Sprintf("crashing after write %d: %s", i+1, row))
		run(i + 1)
	}
}

// Four nodes and a Protected pair whose VM has a persistent disk and a logging network that the
// operator created.
func setupDiskPair(ns string) pairBefore {
	for i := 1; i <= 4; i++ {
		makeNode(fmt.Sprintf("node-%d", i), "zone-a")
	}
	f := newDiskFTVM(ns)
	f.Spec.LoggingNetwork = ftv1.LoggingNetwork{Name: "made-net", Config: `{"cniVersion":"0.3.1","type":"bridge"}`}
	Expect(k8s.Create(ctx(), f)).To(Succeed())
	got := waitFor(ns, "vm", "Protected with a synchronized secondary", func(f *ftv1.FaultTolerantVM) bool {
		return f.Status.State == ftv1.StateProtected && f.Status.Secondary != nil && getVMIAnnotation(ns, f.Status.Secondary.VMI, ftv1.AnnotationSyncedAt) != ""
	})
	return pairBefore{primary: *got.Status.Primary, secondary: *got.Status.Secondary}
}

// expectWholePair checks the end state of a path: Protected, exactly two members, one labelled
// primary (wantPrimary; "" for any), one secondary on another node that is not avoided, the record naming
// the primary, the count, and no claim that no member uses (but the user's).
func expectWholePair(ns, wantPrimary string, failovers int32, avoid ...string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		f := &ftv1.FaultTolerantVM{}
		g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm"}, f)).To(Succeed())
		g.Expect(f.Status.State).To(Equal(ftv1.StateProtected), "conditions %s", conditionsOf(f))
		g.Expect(f.Status.FailoverCount).To(Equal(failovers))
		vmis := members(ns, "vm")
		g.Expect(vmis).To(HaveLen(2), "members %v", names(vmis))
		roles, used := map[string]virtv1.VirtualMachineInstance{}, map[string]bool{"disk": true}
		for _, v := range vmis {
			g.Expect(v.DeletionTimestamp).To(BeNil())
			g.Expect(v.Status.Phase).To(Equal(virtv1.Running))
			g.Expect(avoid).NotTo(ContainElement(v.Labels[ftv1.LabelNode]))
			roles[v.Labels[ftv1.LabelRole]] = v
			for _, vol := range v.Spec.Volumes {
				if vol.PersistentVolumeClaim != nil {
					used[vol.PersistentVolumeClaim.ClaimName] = true
				}
			}
		}
		g.Expect(roles).To(HaveKey(ftv1.RolePrimary))
		g.Expect(roles).To(HaveKey(ftv1.RoleSecondary))
		p, sec := roles[ftv1.RolePrimary], roles[ftv1.RoleSecondary]
		if wantPrimary != "" {
			g.Expect(p.Name).To(Equal(wantPrimary))
		}
		g.Expect(p.Labels[ftv1.LabelNode]).NotTo(Equal(sec.Labels[ftv1.LabelNode]))
		g.Expect(sec.Annotations[ftv1.AnnotationFollows]).To(Equal(p.Name))
		lease := &coordinationv1.Lease{}
		g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: ftv1.RecordName("vm")}, lease)).To(Succeed())
		g.Expect(*lease.Spec.HolderIdentity).To(Equal(ftv1.SideIdentity(p.Labels[ftv1.LabelNode], p.Name)))
		g.Expect(int64(*lease.Spec.LeaseTransitions)).To(Equal(f.Status.Epoch))
		var pvcs corev1.PersistentVolumeClaimList
		g.Expect(k8s.List(ctx(), &pvcs, client.InNamespace(ns))).To(Succeed())
		for _, c := range pvcs.Items {
			if c.DeletionTimestamp == nil { // (see leftovers)
				g.Expect(used).To(HaveKey(c.Name), "claim %s is used by no member", c.Name)
			}
		}
	}, timeout, interval).Should(Succeed())
}

func names(vmis []virtv1.VirtualMachineInstance) []string {
	out := []string{}
	for _, v := range vmis {
		out = append(out, fmt.Sprintf("%s(%s,deleting=%v)", v.Name, v.Labels[ftv1.LabelRole], v.DeletionTimestamp != nil))
	}
	return out
}

var _ = Describe("Crash points", func() {
	AfterEach(func() { deleteAllNodes() })

	It("a failover converges from a crash after any of its writes: one primary, the count grown by one, nothing extra", func() {
		runCrashPath(crashPath{
			setup: setupDiskPair,
			trigger: func(_ string, b pairBefore) {
				setNodeReady(b.primary.Node, false)
			},
			check: func(ns string, b pairBefore) {
				expectWholePair(ns, b.secondary.VMI, 1, b.primary.Node)
			},
			rows: []string{
				"update Lease ft-vm",                     // the record: vm-2 at epoch 2, one promotion
				"patch PersistentVolumeClaim vm-2-root",  // its disk is the VM's now
				"patch PersistentVolumeClaim disk",       // the user's claim superseded by it
				"patch VirtualMachineInstance vm-1",      // the old primary labelled fenced
				"delete VirtualMachineInstance vm-1",     // and deleted
				"patch VirtualMachineInstance vm-2",      // the new one labelled primary
				"update Lease ft-vm",                     // the name vm-3 handed out, before anything of it is made
				"create PersistentVolumeClaim vm-3-root", // a new secondary's copy
				"create VirtualMachineInstance vm-3",
				status("FaultTolerantVM", "vm"),
				"patch VirtualMachineInstance vm-3", // synchronized
				status("FaultTolerantVM", "vm"),
			},
		})
	})

	It("a re-protection converges from a crash after any of its writes: the same primary, a new secondary, no failover", func() {
		runCrashPath(crashPath{
			setup: setupDiskPair,
			trigger: func(_ string, b pairBefore) {
				setNodeReady(b.secondary.Node, false)
			},
			check: func(ns string, b pairBefore) {
				expectWholePair(ns, b.primary.VMI, 0, b.secondary.Node)
			},
			rows: []string{
				"update Lease ft-vm", // the lost secondary's node suspect, before it is let go
				"delete VirtualMachineInstance vm-2",
				"update Lease ft-vm", // the name vm-3 handed out, before anything of it is made
				"create PersistentVolumeClaim vm-3-root",
				"create VirtualMachineInstance vm-3",
				"delete PersistentVolumeClaim vm-2-root", // the lost secondary's copy
				status("FaultTolerantVM", "vm"),
				"patch VirtualMachineInstance vm-3",
				status("FaultTolerantVM", "vm"),
			},
		})
	})

	It("a restart from disk converges from a crash after any of its writes: one new pair, no failover", func() {
		runCrashPath(crashPath{
			setup: setupDiskPair,
			trigger: func(_ string, b pairBefore) {
				// Both members' nodes stop answering at the same moment and are lost together when
				// the grace runs out: no copy of the running VM survives.
				at := metav1.Now()
				for _, n := range []string{b.primary.Node, b.secondary.Node} {
					setNodeUnknownSince(n, at)
				}
			},
			check: func(ns string, b pairBefore) {
				// A new pair, away from the lost nodes: vm-3 and vm-4, or, when the crash came after
				// the record handed those names out but before vm-3 was made, vm-5 and vm-6.
				expectWholePair(ns, "", 0, b.primary.Node, b.secondary.Node)
			},
			rows: []string{
				status("FaultTolerantVM", "vm"),      // both nodes suspect
				"update Lease ft-vm",                 // released: nobody may run the VM
				"patch VirtualMachineInstance vm-1",  // the lost primary labelled fenced
				"delete VirtualMachineInstance vm-1", // and deleted
				"delete VirtualMachineInstance vm-2", // its lost secondary
				"update Lease ft-vm",                 // the new primary takes the record
				"create VirtualMachineInstance vm-3", // on the VM's disk
				"create PersistentVolumeClaim vm-4-root",
				"create VirtualMachineInstance vm-4",
				"delete PersistentVolumeClaim vm-2-root", // the old secondary's copy
				status("FaultTolerantVM", "vm"),
				"patch VirtualMachineInstance vm-4", // synchronized
				status("FaultTolerantVM", "vm"),
			},
		})
	})

	It("a test failover converges from a crash after any of its writes: done once, one primary, the count grown by one", func() {
		runCrashPath(crashPath{
			setup: setupDiskPair,
			trigger: func(ns string, _ pairBefore) {
				Expect(k8s.Create(ctx(), &ftv1.FaultTolerantVMOperation{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "test"},
					Spec:       ftv1.FaultTolerantVMOperationSpec{FaultTolerantVMName: "vm", Type: ftv1.OperationTestFailover},
				})).To(Succeed())
			},
			check: func(ns string, b pairBefore) {
				expectWholePair(ns, b.secondary.VMI, 1) // the old primary's node is healthy: it may take the new secondary
				Eventually(func(g Gomega) {
					op := &ftv1.FaultTolerantVMOperation{}
					g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "test"}, op)).To(Succeed())
					g.Expect(op.Status.Phase).To(Equal(ftv1.OperationSucceeded), op.Status.Message)
					g.Expect(op.Status.Result.Primary.VMI).To(Equal(b.secondary.VMI))
				}, timeout, interval).Should(Succeed())
				Expect(getFTVM(ns, "vm").Status.FailoverCount).To(Equal(int32(1)), "done exactly once")
			},
			rows: []string{
				status("FaultTolerantVMOperation", "test"), // Running, on vm-1 and vm-2: before anything is done
				"update Lease ft-vm",                       // the record: vm-2 at epoch 2, with the operation's UID
				"patch PersistentVolumeClaim vm-2-root",    // its disk is the VM's now
				"patch PersistentVolumeClaim disk",         // the user's claim superseded by it
				"patch VirtualMachineInstance vm-1",        // the old primary labelled fenced
				"delete VirtualMachineInstance vm-1",       // and deleted
				"patch VirtualMachineInstance vm-2",        // the new one labelled primary
				status("FaultTolerantVMOperation", "test"), // "took over"
				status("FaultTolerantVM", "vm"),
				"update Lease ft-vm",                     // the name vm-3 handed out, before anything of it is made
				"create PersistentVolumeClaim vm-3-root", // a new secondary's copy
				"create VirtualMachineInstance vm-3",
				status("FaultTolerantVMOperation", "test"), // waiting for it to synchronize
				status("FaultTolerantVM", "vm"),
				"patch VirtualMachineInstance vm-3", // synchronized
				status("FaultTolerantVM", "vm"),
				status("FaultTolerantVMOperation", "test"), // Succeeded
			},
		})
	})

	It("a drain of the primary's node converges from a crash after the operation is made: the VM handed over once, the new secondary elsewhere", func() {
		var drained string
		runCrashPath(crashPath{
			setup: setupDiskPair,
			trigger: func(ns string, b pairBefore) {
				drained = b.primary.Node
				drain(ns, b.primary.VMI, drained)
			},
			check: func(ns string, b pairBefore) {
				expectWholePair(ns, b.secondary.VMI, 1, drained)
				Eventually(func(g Gomega) {
					op := &ftv1.FaultTolerantVMOperation{}
					g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm-1-evacuation"}, op)).To(Succeed())
					g.Expect(op.Status.Phase).To(Equal(ftv1.OperationSucceeded), op.Status.Message)
				}, timeout, interval).Should(Succeed())
			},
			// After the operation is made, the path is the test failover's (above).
			crashRows: []int{1, 2},
			rows: []string{
				"create FaultTolerantVMOperation vm-1-evacuation",     // before anything is done
				status("FaultTolerantVMOperation", "vm-1-evacuation"), // Running, on vm-1 and vm-2
				"update Lease ft-vm",                    // the record: vm-2, with the operation's UID
				"patch PersistentVolumeClaim vm-2-root", // its disk is the VM's now
				"patch PersistentVolumeClaim disk",      // the user's claim superseded by it
				"patch VirtualMachineInstance vm-1",     // the old primary labelled fenced
				"delete VirtualMachineInstance vm-1",    // and deleted: the drain goes on
				"patch VirtualMachineInstance vm-2",     // the new one labelled primary
				status("FaultTolerantVMOperation", "vm-1-evacuation"),
				status("FaultTolerantVM", "vm"),
				"update Lease ft-vm",                     // the name vm-3 handed out
				"create PersistentVolumeClaim vm-3-root", // on a node other than the drained one
				"create VirtualMachineInstance vm-3",
				status("FaultTolerantVMOperation", "vm-1-evacuation"),
				status("FaultTolerantVM", "vm"),
				"patch VirtualMachineInstance vm-3", // synchronized
				status("FaultTolerantVM", "vm"),
				status("FaultTolerantVMOperation", "vm-1-evacuation"), // Succeeded
			},
		})
	})

	It("a suspension of protection converges from a crash after any of its writes: the node reserved before the secondary stops", func() {
		runCrashPath(crashPath{
			setup: setupDiskPair,
			trigger: func(ns string, _ pairBefore) {
				setProtection(ns, "vm", ftv1.ProtectionSuspended)
			},
			check: func(ns string, b pairBefore) {
				Eventually(func(g Gomega) {
					f := &ftv1.FaultTolerantVM{}
					g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm"}, f)).To(Succeed())
					c := apimeta.FindStatusCondition(f.Status.Conditions, ftv1.ConditionProtected)
					g.Expect(c).NotTo(BeNil())
					g.Expect(c.Reason).To(Equal(ftv1.ReasonProtectionSuspended))
					g.Expect(f.Status.Primary.VMI).To(Equal(b.primary.VMI))
					g.Expect(members(ns, "vm")).To(HaveLen(1))
					lease := &coordinationv1.Lease{}
					g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: ftv1.RecordName("vm")}, lease)).To(Succeed())
					g.Expect(lease.Annotations).To(HaveKeyWithValue(ftv1.AnnotationReservedNode, b.secondary.Node))
				}, timeout, interval).Should(Succeed())
			},
			rows: []string{
				"update Lease ft-vm",                 // the secondary's node reserved in the record, first
				"delete VirtualMachineInstance vm-2", // then the secondary stopped
				status("FaultTolerantVM", "vm"),
				// (disk copies are collected only while the pair is whole: vm-2-root waits for the resume)
			},
		})
	})

	It("a resumption of protection converges from a crash after any of its writes: the new secondary on the reserved node, the reservation released", func() {
		runCrashPath(crashPath{
			setup: func(ns string) pairBefore {
				b := setupDiskPair(ns)
				setProtection(ns, "vm", ftv1.ProtectionSuspended)
				Eventually(func() []virtv1.VirtualMachineInstance { return members(ns, "vm") }, timeout, interval).Should(HaveLen(1))
				return b
			},
			trigger: func(ns string, _ pairBefore) {
				setProtection(ns, "vm", ftv1.ProtectionEnabled)
			},
			check: func(ns string, b pairBefore) {
				expectWholePair(ns, b.primary.VMI, 0)
				Eventually(func(g Gomega) {
					f := getFTVM(ns, "vm")
					g.Expect(f.Status.Secondary.Node).To(Equal(b.secondary.Node), "the reserved node")
					lease := &coordinationv1.Lease{}
					g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: ftv1.RecordName("vm")}, lease)).To(Succeed())
					g.Expect(lease.Annotations).NotTo(HaveKey(ftv1.AnnotationReservedNode))
				}, timeout, interval).Should(Succeed())
			},
			rows: []string{
				"update Lease ft-vm",                     // the name vm-3 handed out, before anything of it is made
				"create PersistentVolumeClaim vm-3-root", // a new secondary's copy
				"create VirtualMachineInstance vm-3",     // on the reserved node
				"delete PersistentVolumeClaim vm-2-root", // the pair is whole: the suspended secondary's copy goes
				status("FaultTolerantVM", "vm"),
				"patch VirtualMachineInstance vm-3", // synchronized
				"update Lease ft-vm",                // the reservation released: the secondary holds its place
				status("FaultTolerantVM", "vm"),
			},
		})
	})

	It("a deletion converges from a crash after any of its writes: nothing is left", func() {
		runCrashPath(crashPath{
			setup: setupDiskPair,
			trigger: func(ns string, _ pairBefore) {
				Expect(k8s.Delete(ctx(), getFTVM(ns, "vm"))).To(Succeed())
			},
			check: func(ns string, _ pairBefore) {
				expectDeleted(ns)
			},
			rows: []string{
				"update Lease ft-vm",                // released: nobody may run the VM
				"patch VirtualMachineInstance vm-1", // the primary labelled fenced
				"delete VirtualMachineInstance vm-1",
				"delete VirtualMachineInstance vm-2",
				"delete PersistentVolumeClaim vm-2-root",
				"delete Lease ft-vm",
				"delete NetworkAttachmentDefinition made-net",
				"patch FaultTolerantVM vm", // the finalizer released
			},
		})
	})

	It("a deletion after a failover converges from a crash after any of its writes: the VM's current disk is kept, nothing else is left", func() {
		runCrashPath(crashPath{
			setup: setupFailedOverPair,
			trigger: func(ns string, _ pairBefore) {
				Expect(k8s.Delete(ctx(), getFTVM(ns, "vm"))).To(Succeed())
			},
			check: func(ns string, _ pairBefore) {
				expectDeleted(ns)
				expectRetained(ns, "vm-2-root", "root", "disk")
				Eventually(eventMessages, timeout, interval).WithArguments(ns, "vm", ftv1.ReasonDisksRetained).
					Should(ContainSubstring("vm-2-root (volume root, in place of claim disk)"), "the event names the kept claim")
			},
			rows: []string{
				"update Lease ft-vm",                // released: nobody may run the VM
				"patch VirtualMachineInstance vm-2", // the primary labelled fenced
				"delete VirtualMachineInstance vm-2",
				"delete VirtualMachineInstance vm-3",
				"patch PersistentVolumeClaim vm-2-root", // the VM's disk kept: no owner, labelled retained
				"delete PersistentVolumeClaim vm-3-root",
				"delete Lease ft-vm",
				"delete NetworkAttachmentDefinition made-net",
				"patch FaultTolerantVM vm", // the finalizer released
			},
		})
	})
})

var _ = Describe("Crash points, with KubeVirt's launcher pods", func() {
	AfterEach(func() { deleteAllNodes() })

	It("a failover whose lost primary keeps a launcher pod converges from a crash after any of its writes: the pod released once the record moved, the old primary gone", func() {
		runCrashPath(crashPath{
			setup:        setupDiskPair,
			launcherPods: true,
			trigger: func(_ string, b pairBefore) {
				setNodeReady(b.primary.Node, false)
			},
			check: func(ns string, b pairBefore) {
				expectWholePair(ns, b.secondary.VMI, 1, b.primary.Node)
				Eventually(isGone(ns, b.primary.VMI), timeout, interval).Should(BeTrue(), "the lost primary finished")
			},
			uncrashed: func(ns string, b pairBefore) {
				Eventually(eventMessages, timeout, interval).WithArguments(ns, "vm", ftv1.ReasonLauncherReleased).Should(ContainSubstring("virt-launcher-"+b.primary.VMI), "the event names the released pod")
			},
			// The failover's rows (above), with the launcher pods': the writes after the pod's
			// release are the failover's, crashed after there.
			prefix: true,
			// The fenced primary's pod is relabelled only by a reconcile whose cache showed vm-1
			// fenced but not yet deleted.
			optional: []string{"patch Pod virt-launcher-vm-1"},
			rows: []string{
				"update Lease ft-vm",                     // the record: vm-2 at epoch 2, one promotion
				"patch PersistentVolumeClaim vm-2-root",  // its disk is the VM's now
				"patch PersistentVolumeClaim disk",       // the user's claim superseded by it
				"patch VirtualMachineInstance vm-1",      // the old primary labelled fenced
				"delete VirtualMachineInstance vm-1",     // and deleted: it stays, with its pod
				"patch VirtualMachineInstance vm-2",      // the new one labelled primary
				"patch Pod virt-launcher-vm-2",           // and its launcher pod
				"update Lease ft-vm",                     // the name vm-3 handed out, before anything of it is made
				"create PersistentVolumeClaim vm-3-root", // a new secondary's copy
				"create VirtualMachineInstance vm-3",
				status("FaultTolerantVM", "vm"),
				"delete Pod virt-launcher-vm-1", // vm-2 holds the record: the lost primary's pod released
			},
		})
	})

	It("a deletion while the primary's node is lost converges from a crash after any of its writes: the lost primary's pod released, nothing is left", func() {
		runCrashPath(crashPath{
			setup:        setupDiskPair,
			launcherPods: true,
			trigger: func(ns string, b pairBefore) {
				// The node stops answering as the user deletes the VM: it is lost only once the
				// grace has run out, after the deletion started.
				seen := getFTVM(ns, "vm").ResourceVersion
				setNodeUnknownSince(b.primary.Node, metav1.Now())
				// The status says so (the table's first row) before the user deletes the VM.
				Eventually(func() string { return getFTVM(ns, "vm").ResourceVersion }, timeout, interval).ShouldNot(Equal(seen))
				Expect(k8s.Delete(ctx(), getFTVM(ns, "vm"))).To(Succeed())
			},
			check: func(ns string, b pairBefore) {
				expectDeleted(ns)
			},
			uncrashed: func(ns string, _ pairBefore) {
				Eventually(eventMessages, timeout, interval).WithArguments(ns, "vm", ftv1.ReasonLauncherReleased).
					Should(ContainSubstring("no holder for a whole term"), "the event says why the pod may go")
			},
			rows: []string{
				status("FaultTolerantVM", "vm"),      // the primary's node suspect
				"update Lease ft-vm",                 // released: nobody may run the VM
				"patch VirtualMachineInstance vm-1",  // the primary labelled fenced
				"delete VirtualMachineInstance vm-1", // it stays, with its pod, on its lost node
				"delete VirtualMachineInstance vm-2", // its kubelet ends its pod
				"delete Pod virt-launcher-vm-1",      // once the node is lost: nobody holds the record
				"delete PersistentVolumeClaim vm-2-root",
				"delete Lease ft-vm",
				"delete NetworkAttachmentDefinition made-net",
				"patch FaultTolerantVM vm", // the finalizer released
			},
		})
	})
})

// withLauncherPods makes kubevirtdouble.LauncherPods give the VMIs of ns launcher pods.
func withLauncherPods(ns string) {
	GinkgoHelper()
	n := &corev1.Namespace{}
	Expect(k8s.Get(ctx(), types.NamespacedName{Name: ns}, n)).To(Succeed())
	base := n.DeepCopy()
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels[kubevirtdouble.LabelLauncherPods] = ""
	Expect(k8s.Patch(ctx(), n, client.MergeFrom(base))).To(Succeed())
}

// A pair that failed over once: the VM's disk is now the copy vm-2-root, its secondary vm-3.
func setupFailedOverPair(ns string) pairBefore {
	b := setupDiskPair(ns)
	setNodeReady(b.primary.Node, false)
	expectWholePair(ns, b.secondary.VMI, 1, b.primary.Node)
	f := getFTVM(ns, "vm")
	return pairBefore{primary: *f.Status.Primary, secondary: *f.Status.Secondary}
}

// expectRetained checks that a claim the operator made is kept as the VM's current disk of the
// deleted FaultTolerantVM vm: no owner, not labelled a copy, labelled as retained, and the
// user's claim it replaces annotated as superseded by it.
func expectRetained(ns, claim, volume, userClaim string) {
	GinkgoHelper()
	c := &corev1.PersistentVolumeClaim{}
	Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: claim}, c)).To(Succeed(), "the VM's current disk is kept")
	Expect(c.DeletionTimestamp).To(BeNil())
	Expect(c.OwnerReferences).To(BeEmpty())
	Expect(c.Labels).To(HaveKeyWithValue(ftv1.LabelRetainedFrom, "vm"))
	Expect(c.Labels).NotTo(HaveKey(ftv1.LabelManagedBy))
	Expect(c.Labels).NotTo(HaveKey(ftv1.LabelPair))
	Expect(c.Labels).To(HaveKeyWithValue("ft.lockstep.dev/volume", volume))
	Expect(c.Annotations).To(HaveKeyWithValue(ftv1.AnnotationSourceClaim, userClaim))
	user := &corev1.PersistentVolumeClaim{}
	Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: userClaim}, user)).To(Succeed())
	Expect(user.Annotations).To(HaveKeyWithValue(ftv1.AnnotationSupersededBy, claim))
}

// expectDeleted waits until the FaultTolerantVM vm is gone, and with it all the operator made.
func expectDeleted(ns string) {
	GinkgoHelper()
	Eventually(func() bool {
		err := k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm"}, &ftv1.FaultTolerantVM{})
		return apierrors.IsNotFound(err)
	}, timeout, interval).Should(BeTrue())
	Eventually(leftoversIn(ns), timeout, interval).Should(BeEmpty())
}

// leftoversIn lists what the operator made in a namespace that is still there.
func leftoversIn(ns string) func() []string {
	return func() []string {
		var out []string
		for _, l := range leftovers() {
			if strings.Contains(l, " "+ns+"/") {
				out = append(out, l)
			}
		}
		return out
	}
}

// primaryWatch watches a namespace's VMIs and records every moment at which two of them ran the
// VM at once (being deleted or not): two members labelled primary, or one and the VMI of a plain
// VirtualMachine (adoption and release).
type primaryWatch struct {
	w    watch.Interface
	done chan struct{}
	mu   sync.Mutex
	bad  []string
}

func watchPrimaries(ns string) *primaryWatch {
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: controllers.NewScheme()})
	Expect(err).NotTo(HaveOccurred())
	w, err := wc.Watch(ctx(), &virtv1.VirtualMachineInstanceList{}, client.InNamespace(ns))
	Expect(err).NotTo(HaveOccurred())
	pw := &primaryWatch{w: w, done: make(chan struct{})}
	go func() {
		defer close(pw.done)
		role := map[string]string{}
		for ev := range w.ResultChan() {
			v, ok := ev.Object.(*virtv1.VirtualMachineInstance)
			if !ok {
				continue
			}
			switch {
			case ev.Type == watch.Deleted:
				delete(role, v.Name)
			case ownedByVirtualMachine(v):
				role[v.Name] = roleVirtualMachine
			default:
				role[v.Name] = v.Labels[ftv1.LabelRole]
			}
			var primaries []string
			for name, r := range role {
				if r == ftv1.RolePrimary || r == roleVirtualMachine {
					primaries = append(primaries, name)
				}
			}
			if len(primaries) > 1 {
				pw.mu.Lock()
				pw.bad = append(pw.bad, fmt.Sprintf("%v labelled primary at once", primaries))
				pw.mu.Unlock()
			}
		}
	}()
	return pw
}

// roleVirtualMachine stands, in a primaryWatch, for the VMI of a plain VirtualMachine (one that a
// FaultTolerantVM adopts, or is released into): it runs the VM as a primary does.
const roleVirtualMachine = "virtualmachine"

func ownedByVirtualMachine(v *virtv1.VirtualMachineInstance) bool {
	owner := metav1.GetControllerOf(v)
	return owner != nil && owner.Kind == "VirtualMachine"
}

func (pw *primaryWatch) stop() { pw.w.Stop(); <-pw.done }

func (pw *primaryWatch) violations() []string {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	return pw.bad
}

var _ = Describe("Restarting a FaultTolerantVM after a failover", func() {
	AfterEach(func() { deleteAllNodes() })

	It("never starts the VM from the claim a failover superseded, when a renamed volume no longer finds the newer copy", func() {
		ns := newNamespace()
		setupFailedOverPair(ns)
		f := getFTVM(ns, "vm")
		base := f.DeepCopy()
		f.Spec.RunStrategy = ftv1.RunStrategyHalted
		Expect(k8s.Patch(ctx(), f, client.MergeFrom(base))).To(Succeed())
		waitForState(ns, "vm", ftv1.StateStopped)
		Eventually(func() []virtv1.VirtualMachineInstance { return members(ns, "vm") }, timeout, interval).Should(BeEmpty())
		// The volume is renamed: the pair's copies are known by the old name.
		f = getFTVM(ns, "vm")
		base = f.DeepCopy()
		old := f.Spec.Template.Spec.Volumes[0].Name
		f.Spec.Template.Spec.Volumes[0].Name = "system"
		for i := range f.Spec.Template.Spec.Domain.Devices.Disks {
			if f.Spec.Template.Spec.Domain.Devices.Disks[i].Name == old {
				f.Spec.Template.Spec.Domain.Devices.Disks[i].Name = "system"
			}
		}
		f.Spec.RunStrategy = ftv1.RunStrategyRunning
		Expect(k8s.Patch(ctx(), f, client.MergeFrom(base))).To(Succeed())
		waitFor(ns, "vm", "refused with the superseded claim named", func(f *ftv1.FaultTolerantVM) bool {
			c := condition(f, ftv1.ConditionPrimaryReady)
			return c != nil && strings.Contains(c.Message, `claim "disk" holds an older state`) && strings.Contains(c.Message, "vm-2-root")
		})
		// Refused before the record is written: no epoch and no name spent at each retry.
		record := &coordinationv1.Lease{}
		key := types.NamespacedName{Namespace: ns, Name: ftv1.RecordName("vm")}
		Expect(k8s.Get(ctx(), key, record)).To(Succeed())
		epoch, ordinal := *record.Spec.LeaseTransitions, record.Annotations[ftv1.AnnotationLastOrdinal]
		Consistently(func(g Gomega) {
			g.Expect(members(ns, "vm")).To(BeEmpty())
			g.Expect(k8s.Get(ctx(), key, record)).To(Succeed())
			g.Expect(*record.Spec.LeaseTransitions).To(Equal(epoch))
			g.Expect(record.Annotations[ftv1.AnnotationLastOrdinal]).To(Equal(ordinal))
		}, 2*time.Second, interval).Should(Succeed())

		// The template names the newer claim: the VM starts from it.
		f = getFTVM(ns, "vm")
		base = f.DeepCopy()
		f.Spec.Template.Spec.Volumes[0].PersistentVolumeClaim.ClaimName = "vm-2-root"
		Expect(k8s.Patch(ctx(), f, client.MergeFrom(base))).To(Succeed())
		Eventually(func() []virtv1.VirtualMachineInstance { return members(ns, "vm") }, timeout, interval).ShouldNot(BeEmpty())

		f = getFTVM(ns, "vm")
		base = f.DeepCopy()
		f.Spec.DiskRetention = ftv1.DiskRetentionDelete
		Expect(k8s.Patch(ctx(), f, client.MergeFrom(base))).To(Succeed())
		Expect(k8s.Delete(ctx(), f)).To(Succeed())
		Eventually(leftoversIn(ns), timeout, interval).Should(BeEmpty())
	})
})

var _ = Describe("Deleting a FaultTolerantVM after a failover", func() {
	AfterEach(func() { deleteAllNodes() })

	It("with diskRetention Delete deletes every copy, the VM's current disk among them; the user's claim stays, marked superseded", func() {
		ns := newNamespace()
		setupFailedOverPair(ns)
		f := getFTVM(ns, "vm")
		base := f.DeepCopy()
		f.Spec.DiskRetention = ftv1.DiskRetentionDelete
		Expect(k8s.Patch(ctx(), f, client.MergeFrom(base))).To(Succeed())
		Expect(k8s.Delete(ctx(), f)).To(Succeed())
		Eventually(leftoversIn(ns), timeout, interval).Should(BeEmpty())
		Eventually(func(g Gomega) {
			var pvcs corev1.PersistentVolumeClaimList
			g.Expect(k8s.List(ctx(), &pvcs, client.InNamespace(ns))).To(Succeed())
			for _, c := range pvcs.Items {
				if c.Name != "disk" {
					g.Expect(c.DeletionTimestamp).NotTo(BeNil(), "claim %s is deleted", c.Name)
				}
			}
		}, timeout, interval).Should(Succeed())
		user := &corev1.PersistentVolumeClaim{}
		Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "disk"}, user)).To(Succeed())
		Expect(user.DeletionTimestamp).To(BeNil(), "the template's claim is never deleted")
		Expect(user.Annotations).To(HaveKeyWithValue(ftv1.AnnotationSupersededBy, "vm-2-root"))
		Expect(eventReasons(ns, "vm")).NotTo(ContainElement(ftv1.ReasonDisksRetained))
	})
})

var _ = Describe("A VM on a DataVolume", func() {
	AfterEach(func() { deleteAllNodes() })

	It("is protected: the primary keeps the dataVolume volume, the secondary gets a plain copy of its claim", func() {
		ns := newNamespace()
		for i := 1; i <= 3; i++ {
			makeNode(fmt.Sprintf("node-%d", i), "zone-a")
		}
		createClaim(ns, "imported", "3Gi") // CDI names the DataVolume's claim as the DataVolume
		f := newFTVM(ns, "vm")
		f.Spec.Template.Spec.Volumes[0].VolumeSource = virtv1.VolumeSource{DataVolume: &virtv1.DataVolumeSource{Name: "imported"}}
		Expect(k8s.Create(ctx(), f)).To(Succeed())
		got := waitFor(ns, "vm", "Protected", func(f *ftv1.FaultTolerantVM) bool { return f.Status.State == ftv1.StateProtected })
		p, err := getVMI(ns, got.Status.Primary.VMI)
		Expect(err).NotTo(HaveOccurred())
		s, err := getVMI(ns, got.Status.Secondary.VMI)
		Expect(err).NotTo(HaveOccurred())
		Expect(p.Spec.Volumes[0].DataVolume).To(Equal(&virtv1.DataVolumeSource{Name: "imported"}))
		Expect(s.Spec.Volumes[0].DataVolume).To(BeNil())
		Expect(s.Spec.Volumes[0].PersistentVolumeClaim).NotTo(BeNil())
		copyName := s.Spec.Volumes[0].PersistentVolumeClaim.ClaimName
		Expect(copyName).To(Equal(s.Name + "-root"))
		c := &corev1.PersistentVolumeClaim{}
		Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: copyName}, c)).To(Succeed())
		Expect(c.Annotations).To(HaveKeyWithValue(ftv1.AnnotationSourceClaim, "imported"))
		Expect(c.Spec.Resources.Requests[corev1.ResourceStorage]).To(Equal(resource.MustParse("3Gi")))
		deleteAllFTVMs(ns)
	})
})
