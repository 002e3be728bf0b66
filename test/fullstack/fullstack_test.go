//go:build fullstack

package fullstack

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	virtv1 "kubevirt.io/api/core/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/test/chaos"
	"github.com/lockstep-dev/lockstep/test/kubevirtdouble"
)

// specStart is when the running spec began (its events are the ones that explain a violation).
var specStart time.Time

// The FaultTolerantVM of testdata/counter-vm.yaml and its guest's address.
const (
	ftvmName = "counter"
	vmAddr   = "10.214.0.10:7777"
)

var _ = Describe("A protected VM on the full stack", Ordered, func() {
	var cl *client
	var guest *guestApps

	BeforeAll(func() {
		guest = newGuestApps()
		kubectl("apply", "-f", guest.vmManifest())
	})
	AfterAll(func() {
		guest.stop()
		if cl != nil {
			cl.stop()
			expectNoViolation(cl)
			GinkgoWriter.Printf("the client got %d replies; the last: count=%d\n", cl.Count(), cl.Last().Count)
		}
	})
	BeforeEach(func() { specStart = time.Now() })
	AfterEach(func() {
		expectNoViolation(cl)
		guest.check(CurrentSpecReport().LeafNodeText)
	})

	It("reaches Protected with lockstepd's report of both sides, and the interval and bandwidth of real checkpoints", func() {
		start := time.Now()
		f := waitFor("Protected, with both sides reported", 5*time.Minute, func(f *ftv1.FaultTolerantVM) bool {
			r := f.Status.Replication
			return f.Status.State == ftv1.StateProtected && r != nil && r.Primary != nil && r.Secondary != nil &&
				r.Primary.State == ftv1.SideProtected && r.Secondary.Synchronized && f.Status.VLockstepInterval != nil && f.Status.LogBandwidth != nil
		})
		figures.Add("apply → Protected (boot, disk resync, COLO)", time.Since(start))
		Expect(f.Status.Primary.Node).NotTo(Equal(f.Status.Secondary.Node))
		Expect(f.Status.Replication.Primary.VMI).To(Equal(f.Status.Primary.VMI))
		Expect(f.Status.Replication.Secondary.VMI).To(Equal(f.Status.Secondary.VMI))
		Expect(f.Status.LogBandwidth.Value()).To(BeNumerically(">", 0), "checkpoints carry the guest's memory")
		cols := kubectl("get", "ftvm", ftvmName, "--no-headers")
		Expect(strings.Fields(cols)).To(HaveLen(7), "NAME STATE PRIMARY SECONDARY INTERVAL BANDWIDTH AGE, all filled: %q", cols)
		By("both members run lockstep's QEMU from the image their launcher pods mount")
		expectLockstepQEMU(f.Status.Primary.VMI)
		expectLockstepQEMU(f.Status.Secondary.VMI)

		// Protection starts with the guest's boot (the secondary follows it), and the Debian guest
		// takes a minute or two under TCG to start its services.
		cl = startClient(vmAddr)
		Eventually(cl.Count, 4*time.Minute, 100*time.Millisecond).Should(BeNumerically(">=", 5), "the VM answers the client")
		figures.Add("apply → the counter's fifth reply (the guest booted)", time.Since(start))
		By("the guest's PostgreSQL and Postfix, on its data disk, serve their clients")
		guest.start()
	})

	It("fails over on kill -9 of the primary's QEMU: every acknowledged transfer and accepted message there, PostgreSQL never restarted", func() {
		f := protected()
		p, s := *f.Status.Primary, *f.Status.Secondary
		failovers := f.Status.FailoverCount
		killed := time.Now()
		Expect(syscall.Kill(qemuPID(p.VMI), syscall.SIGKILL)).To(Succeed())
		Eventually(recordHolder, time.Minute, 20*time.Millisecond).Should(Equal(ftv1.SideIdentity(s.Node, s.VMI)), "the secondary goes live")
		_, first := waitReplyAfter(cl, killed)
		figures.Add("kill -9 of the primary's QEMU: kill → the client's next reply", first.At.Sub(killed))
		Eventually(memberExists, 2*time.Minute, 100*time.Millisecond).WithArguments(p.VMI).Should(BeFalse(), "%s goes", p.VMI)
		again := protectedAfter(killed)
		figures.Add("kill -9 of the primary's QEMU: kill → Protected again", time.Since(killed))
		Expect(again.Status.Primary.VMI).To(Equal(s.VMI))
		Expect(again.Status.FailoverCount).To(Equal(failovers + 1))
		expectOnePrimary()
	})

	failover := func(what string) {
		f := protected()
		p, s := *f.Status.Primary, *f.Status.Secondary
		failovers := f.Status.FailoverCount
		killed := killNode(p.Node)

		By("the secondary goes live on lockstepd's decision: the pair's record names it")
		Eventually(recordHolder, time.Minute, 20*time.Millisecond).Should(Equal(ftv1.SideIdentity(s.Node, s.VMI)))
		_, first := waitReplyAfter(cl, killed)
		figures.Add(what+": kill → the client's next reply", first.At.Sub(killed))

		By("the operator promotes it on lockstepd's claim, and says so")
		waitFor("the secondary promoted", time.Minute, func(f *ftv1.FaultTolerantVM) bool {
			return f.Status.Primary != nil && f.Status.Primary.VMI == s.VMI && f.Status.FailoverCount == failovers+1
		})
		promotedAt := time.Now()
		figures.Add(what+": kill → promoted", promotedAt.Sub(killed))
		// Whether the node lifecycle had seen the node go by then is a race against its grace
		// (the envtest suite proves that the operator does not wait for it; the figure above
		// is how long it took): what is asserted is that the promotion followed lockstepd's claim.
		Eventually(promotionNote, 10*time.Second, 200*time.Millisecond).WithArguments(s.VMI).
			Should(ContainSubstring("lockstepd won the pair's Lease"), "the Failover event names lockstepd's claim as the cause")

		By("a new secondary elsewhere, and lockstepd protects the VM into it (disk resync, COLO)")
		again := waitFor("Protected again", 5*time.Minute, func(f *ftv1.FaultTolerantVM) bool {
			r := f.Status.Replication
			return f.Status.State == ftv1.StateProtected && f.Status.Secondary != nil && f.Status.Secondary.VMI != s.VMI &&
				r != nil && r.Secondary != nil && r.Secondary.VMI == f.Status.Secondary.VMI && r.Secondary.Synchronized
		})
		figures.Add(what+": kill → Protected again", time.Since(killed))
		Expect(again.Status.Primary.VMI).To(Equal(s.VMI))
		Expect(again.Status.Secondary.Node).NotTo(BeElementOf(p.Node, s.Node))
		Expect(again.Status.FailoverCount).To(Equal(failovers + 1))
		expectOnePrimary()
		reviveNode(p.Node)
	}

	It("fails over when the primary's node dies: nothing lost, and protected again", func() {
		failover("the primary's node killed")
	})

	// A node whose clock is minutes off (its NTP broken): every time its lockstepd writes (the
	// record's renewals, its node lease, its reports) is three minutes old when written, and
	// certificates issued a minute ago are not valid yet there. The operator judges such times
	// by when it saw them, so no verdict changes: the secondary moves there and protects the VM,
	// the VM fails over onto it and runs there for a whole term, and the clock comes right again.
	It("keeps its verdicts with a node's clock three minutes behind: the secondary there protects, the VM fails over onto it and holds, nothing lost", func() {
		const skew = -180
		f := protected()
		if cl == nil { // focused alone: the client starts here
			cl = startClient(vmAddr)
		}
		p, s := *f.Status.Primary, *f.Status.Secondary
		target := freeNode(p.Node, s.Node)
		skewClock(target, skew)
		DeferCleanup(cluster, "skew-clock", target, "0") // the later specs' nodes keep time (a no-op when it already does)
		By("the secondary moves to the node whose clock is behind, and protects the VM from there")
		runOperation("migrate-to-skewed-clock", ftv1.OperationMigrateSecondary, target)
		done := waitOperation("migrate-to-skewed-clock")
		Expect(done.Status.Result.Secondary.Node).To(Equal(target))
		f = protected()
		s = *f.Status.Secondary
		failovers := f.Status.FailoverCount
		Consistently(func(g Gomega) {
			expectSamePair(g, getFTVM(), p, s, failovers)
			g.Expect(recordHolder()).To(Equal(ftv1.SideIdentity(p.Node, p.VMI)))
		}, recordTermWait+10*time.Second, time.Second).Should(Succeed(), "nothing moves for a whole term")

		By("the primary's node dies: the secondary, on the clock that is behind, goes live and holds the record for a whole term")
		failover("a failover onto a node whose clock is 3 min behind")
		f = protected()
		Expect(f.Status.Primary.Node).To(Equal(target))
		p, s, failovers = *f.Status.Primary, *f.Status.Secondary, f.Status.FailoverCount
		Eventually(func() time.Duration {
			by, at := recordRenewal()
			if by != ftv1.SideIdentity(p.Node, p.VMI) {
				return 0
			}
			return time.Since(at)
		}, time.Minute, time.Second).Should(BeNumerically(">", 150*time.Second), "the holder's renewals are stamped on its clock, minutes behind")
		Consistently(func(g Gomega) {
			expectSamePair(g, getFTVM(), p, s, failovers)
			g.Expect(recordHolder()).To(Equal(ftv1.SideIdentity(p.Node, p.VMI)))
		}, recordTermWait+10*time.Second, time.Second).Should(Succeed(), "the record is not taken from a holder whose renewals look old")
		expectServing(cl)

		By("the clock comes right (a step of three minutes forward): lockstepd restarts on it, and the VM is protected again")
		skewClock(target, 0)
		again := protected()
		// A primary's lockstepd restart ends its protection, and either side may keep the VM
		// (docs/colo.md, "lockstepd restarts"): the restarted agent reclaims the record first, or
		// the secondary hears the silence first and goes live (a run of 2026-12-07: after 507 ms).
		if again.Status.Primary.VMI == p.VMI {
			Expect(again.Status.FailoverCount).To(Equal(failovers))
		} else {
			Expect(again.Status.Primary.VMI).To(Equal(s.VMI), "only the secondary may have taken the VM over")
			Expect(again.Status.FailoverCount).To(Equal(failovers + 1))
		}
	})

	It("fails over a second time, from the promoted secondary", func() {
		failover("a second failover")
	})

	It("replaces the secondary when its node dies, and the primary serves on", func() {
		f := protected()
		p, s := *f.Status.Primary, *f.Status.Secondary
		failovers := f.Status.FailoverCount
		killed := killNode(s.Node)
		again := waitFor("Protected by a new secondary", 5*time.Minute, func(f *ftv1.FaultTolerantVM) bool {
			return f.Status.State == ftv1.StateProtected && f.Status.Secondary != nil && f.Status.Secondary.VMI != s.VMI &&
				f.Status.Replication != nil && f.Status.Replication.Secondary != nil && f.Status.Replication.Secondary.Synchronized
		})
		figures.Add("the secondary's node killed: kill → Protected again", time.Since(killed))
		Expect(again.Status.Primary.VMI).To(Equal(p.VMI))
		Expect(again.Status.FailoverCount).To(Equal(failovers))
		Expect(again.Status.Secondary.Node).NotTo(Equal(s.Node))
		reviveNode(s.Node)
	})

	It("keeps the VM where it runs when the primary's node loses only its heartbeat, and says why", func() {
		f := protected()
		p, s := *f.Status.Primary, *f.Status.Secondary
		failovers := f.Status.FailoverCount
		cluster("silence-node", p.Node)
		Eventually(func() bool { return nodeReady(p.Node) }, time.Minute, 200*time.Millisecond).Should(BeFalse())
		By("no failover and no restart, well past the grace, while lockstepd reports the pair replicating")
		Consistently(func(g Gomega) { expectSamePair(g, getFTVM(), p, s, failovers) }, 2*nodeLostGrace+10*time.Second, time.Second).Should(Succeed())
		c := apimeta.FindStatusCondition(getFTVM().Status.Conditions, ftv1.ConditionPrimaryReady)
		Expect(c).NotTo(BeNil())
		Expect(c.Reason).To(Equal(ftv1.ReasonNodeSilentReplicating), "the status says why nothing moves: %s", c.Message)
		By("the node comes back: nothing has moved")
		reviveNode(p.Node)
		expectSamePair(Default, protected(), p, s, failovers)
	})

	// A node cut from the control plane, as a network cuts it: no heartbeat, lockstepd without the
	// API server, a kubelet that sees nothing; the VM and logging networks up. Its secondary
	// renews the record for it (the witness), so nothing moves.
	It("keeps a protected primary cut from the API server where it runs: its secondary renews the record for it, no failover, no restart", func() {
		f := protected()
		if cl == nil { // focused alone: the client starts here
			cl = startClient(vmAddr)
		}
		p, s := *f.Status.Primary, *f.Status.Secondary
		failovers, epoch := f.Status.FailoverCount, leaseEpoch()
		cut := cutAPI(p.Node)
		Eventually(func() bool { return nodeReady(p.Node) }, time.Minute, 200*time.Millisecond).Should(BeFalse())
		By("no failover and no restart, well past the record's term and the operator's wait")
		Consistently(func(g Gomega) {
			expectSamePair(g, getFTVM(), p, s, failovers)
			g.Expect(recordHolder()).To(Equal(ftv1.SideIdentity(p.Node, p.VMI)))
		}, recordTermWait+15*time.Second, time.Second).Should(Succeed())
		By("the status says the pair runs protected, its secondary renewing for the primary it cannot see")
		Eventually(func() string {
			c := apimeta.FindStatusCondition(getFTVM().Status.Conditions, ftv1.ConditionProtected)
			if c == nil || c.Status != metav1.ConditionTrue {
				return ""
			}
			return c.Reason
		}, 30*time.Second, time.Second).Should(Equal(ftv1.ReasonWitnessedBySecondary))
		renewedBy, renewed := recordRenewal()
		Expect(renewed).To(BeTemporally(">", cut), "the record was renewed while its holder was cut")
		Expect(renewedBy).To(Equal(ftv1.SideIdentity(s.Node, s.VMI)), "by the secondary, as the primary's witness")
		Expect(leaseEpoch()).To(Equal(epoch))
		expectServing(cl)
		By("the node's path heals: nothing has moved")
		healAPI(p.Node)
		expectSamePair(Default, protected(), p, s, failovers)
	})

	// The path to two primaries that outside readers found: a primary alone, its node cut from the
	// API server. It must pause before the operator starts the VM elsewhere, and never run again.
	It("pauses a primary that runs alone, cut from the API server, and stops it before the VM starts elsewhere: never two running copies, nothing acknowledged lost", func() {
		f := protected()
		if cl == nil { // focused alone: the client starts here
			cl = startClient(vmAddr)
		}
		p := *f.Status.Primary
		setProtection(ftv1.ProtectionSuspended)
		waitFor("suspended", time.Minute, func(f *ftv1.FaultTolerantVM) bool {
			c := apimeta.FindStatusCondition(f.Status.Conditions, ftv1.ConditionProtected)
			return f.Status.Secondary == nil && c != nil && c.Reason == ftv1.ReasonProtectionSuspended
		})
		expectServing(cl)
		By("the client stops: the VM restarts from its disks, a reboot the client would call a violation")
		cl.stop()
		expectNoViolation(cl)
		cl = cutAloneUntilRestarted(guest, "a primary alone cut from the API server", p, cl.Last(), false)
		setProtection(ftv1.ProtectionEnabled)
		protected()
		expectServing(cl)
	})

	// The same path right after a failover: the secondary that went live runs alone until its new
	// secondary synchronizes, with no witness to renew the record for it.
	It("pauses a secondary that went live, cut from the API server before its new secondary synchronized, and stops it before the VM starts elsewhere", func() {
		f := protected()
		if cl == nil { // focused alone: the client starts here
			cl = startClient(vmAddr)
		}
		p, s := *f.Status.Primary, *f.Status.Secondary
		killed := killNode(p.Node)
		Eventually(recordHolder, time.Minute, 20*time.Millisecond).Should(Equal(ftv1.SideIdentity(s.Node, s.VMI)))
		waitReplyAfter(cl, killed)
		cl.stop()
		expectNoViolation(cl)
		// Whether the secondary learned of its new secondary and began protecting into it before
		// the cut is a race: a COLO primary with a secondary cannot pause and stops instead.
		cl = cutAloneUntilRestarted(guest, "a secondary gone live, cut before its new secondary synchronized", s, cl.Last(), true)
		reviveNode(p.Node)
		protected()
		expectServing(cl)
	})

	// Runs after two failovers, so that the primary is a secondary that went live: such a primary
	// once claimed from its old log's epoch, "won" the epoch it already held and released what
	// COLO held, while its secondary won the next epoch and went live too (the client saw a count
	// twice). Both sides must claim a new epoch, and only one may win it.
	It("lets one side serve when the logging network is cut between the two, and protects again once it heals", func() {
		f := protected()
		p, s := *f.Status.Primary, *f.Status.Secondary
		before := leaseEpoch()
		cluster("partition-node", p.Node)
		cut := time.Now()
		By("one side goes on, the other is fenced and its member goes")
		var winner string
		Eventually(func() bool {
			winner = recordHolder()
			return !memberExists(p.VMI) || !memberExists(s.VMI)
		}, 2*time.Minute, 100*time.Millisecond).Should(BeTrue())
		figures.Add("logging partition: cut → the loser's member gone", time.Since(cut))
		Expect(winner).To(BeElementOf(ftv1.SideIdentity(p.Node, p.VMI), ftv1.SideIdentity(s.Node, s.VMI)))
		Expect(leaseEpoch()).To(Equal(before+1), "exactly one claim went through")
		expectOnePrimary()
		_, first := waitReplyAfter(cl, time.Now())
		Expect(first.Count).To(BeNumerically(">", 0))
		cluster("heal-node", p.Node)
		again := waitFor("Protected again after the partition healed", 5*time.Minute, func(f *ftv1.FaultTolerantVM) bool {
			return f.Status.State == ftv1.StateProtected && f.Status.Replication != nil && f.Status.Replication.Secondary != nil &&
				f.Status.Replication.Secondary.Synchronized && f.Status.Secondary != nil && f.Status.Secondary.VMI != s.VMI && f.Status.Secondary.VMI != p.VMI ||
				f.Status.State == ftv1.StateProtected && f.Status.Primary != nil && f.Status.Primary.VMI == p.VMI && f.Status.Secondary != nil && f.Status.Secondary.VMI != s.VMI
		})
		Expect(ftv1.SideIdentity(again.Status.Primary.Node, again.Status.Primary.VMI)).To(Equal(recordHolder()))
	})

	It("never runs two primaries when the operator is killed in the middle of a failover", func() {
		f := protected()
		p, s := *f.Status.Primary, *f.Status.Secondary
		failovers := f.Status.FailoverCount
		cluster("kill", "operator")
		killed := killNode(p.Node)
		Eventually(recordHolder, time.Minute, 20*time.Millisecond).Should(Equal(ftv1.SideIdentity(s.Node, s.VMI)), "lockstepd decides without the operator")
		_, first := waitReplyAfter(cl, killed)
		figures.Add("operator down: kill → the client's next reply", first.At.Sub(killed))
		cluster("start", "operator")
		again := waitFor("Protected again, the operator back", 5*time.Minute, func(f *ftv1.FaultTolerantVM) bool {
			return f.Status.State == ftv1.StateProtected && f.Status.Primary != nil && f.Status.Primary.VMI == s.VMI &&
				f.Status.Secondary != nil && f.Status.Secondary.VMI != s.VMI
		})
		Expect(again.Status.FailoverCount).To(Equal(failovers + 1))
		expectOnePrimary()
		reviveNode(p.Node)
	})

	// vSphere FT's operations (FaultTolerantVMOperation and spec.protection), on every real part.

	// TestFailover, as a drain asks for it: kubectl drain of the primary's node. The KubeVirt double
	// refuses the eviction of the primary's launcher pod as virt-api does and marks its VMI; the
	// operator hands the VM over to its synchronized secondary (a TestFailover operation), and
	// once the old primary and its pod are gone the drain completes.
	It("TestFailover, by kubectl drain of the primary's node: the secondary takes over, nothing lost, a new secondary elsewhere, and the drain completes", func() {
		f := protected()
		p, s := *f.Status.Primary, *f.Status.Secondary
		failovers := f.Status.FailoverCount
		asked := time.Now()
		DeferCleanup(func() { kubectl("uncordon", p.Node) })
		out, err := lc.Kubectl("drain", p.Node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=5m")
		Expect(err).NotTo(HaveOccurred(), out)
		figures.Add("kubectl drain of the primary's node: drain → node drained", time.Since(asked))
		Expect(out).To(ContainSubstring("Eviction triggered evacuation of VMI"), "KubeVirt refused the eviction and evacuated instead")
		done := waitOperation(p.VMI + "-evacuation")
		Expect(done.Spec.Type).To(Equal(ftv1.OperationTestFailover))
		Expect(done.Status.Primary.UID).To(Equal(p.UID))
		Expect(done.Status.Result.Primary.UID).To(Equal(s.UID), "the secondary took over")
		Expect(done.Status.Result.Secondary.UID).NotTo(BeElementOf(p.UID, s.UID))
		again := protected()
		Expect(again.Status.FailoverCount).To(Equal(failovers + 1))
		Expect([]string{again.Status.Primary.Node, again.Status.Secondary.Node}).NotTo(ContainElement(p.Node), "nothing stays on the drained node")
		Expect(recordHolder()).To(Equal(ftv1.SideIdentity(s.Node, s.VMI)))
		expectOnePrimary()
		expectServing(cl)
	})

	It("TestRestartSecondary: a new secondary, and the primary serves on", func() {
		f := protected()
		p, s := *f.Status.Primary, *f.Status.Secondary
		failovers := f.Status.FailoverCount
		asked := time.Now()
		runOperation("restart-secondary", ftv1.OperationTestRestartSecondary, "")
		done := waitOperation("restart-secondary")
		figures.Add("TestRestartSecondary: asked → Succeeded (Protected again)", time.Since(asked))
		Expect(done.Status.Result.Primary.UID).To(Equal(p.UID))
		Expect(done.Status.Result.Secondary.UID).NotTo(Equal(s.UID))
		Expect(protected().Status.FailoverCount).To(Equal(failovers))
		expectServing(cl)
	})

	It("MigrateSecondary: the secondary moves to the node asked for", func() {
		f := protected()
		p, s := *f.Status.Primary, *f.Status.Secondary
		target := freeNode(p.Node, s.Node)
		asked := time.Now()
		runOperation("migrate-secondary", ftv1.OperationMigrateSecondary, target)
		done := waitOperation("migrate-secondary")
		figures.Add("MigrateSecondary: asked → Succeeded (Protected on the new node)", time.Since(asked))
		Expect(done.Status.Result.Secondary.Node).To(Equal(target))
		Expect(done.Status.Result.Primary.UID).To(Equal(p.UID))
		Expect(protected().Status.Secondary.Node).To(Equal(target))
		expectServing(cl)
	})

	It("protection Suspended: the VM serves on alone; Enabled protects it again on the reserved node", func() {
		f := protected()
		if cl == nil { // focused alone: the client starts here
			cl = startClient(vmAddr)
		}
		p, s := *f.Status.Primary, *f.Status.Secondary
		setProtection(ftv1.ProtectionSuspended)
		waitFor("suspended", time.Minute, func(f *ftv1.FaultTolerantVM) bool {
			c := apimeta.FindStatusCondition(f.Status.Conditions, ftv1.ConditionProtected)
			return f.Status.Secondary == nil && c != nil && c.Reason == ftv1.ReasonProtectionSuspended
		})
		expectServing(cl)
		Expect(getFTVM().Status.Primary.UID).To(Equal(p.UID))
		asked := time.Now()
		setProtection(ftv1.ProtectionEnabled)
		again := protected()
		figures.Add("protection Suspended → Enabled: Protected again", time.Since(asked))
		Expect(again.Status.Primary.UID).To(Equal(p.UID))
		Expect(again.Status.Secondary.Node).To(Equal(s.Node), "the reserved node")
		// The new secondary took over the suspended one's copies on that node: the primary's
		// engine copied only what the VM wrote while it ran alone.
		Expect(again.Status.Secondary.VMI).NotTo(Equal(s.VMI))
		last := waitFor("the primary's lockstepd reports the resync", time.Minute, func(f *ftv1.FaultTolerantVM) bool {
			return f.Status.LastResync != nil && f.Status.LastResync.Secondary == again.Status.Secondary.VMI
		}).Status.LastResync
		Expect(ptr.Deref(last.Incremental, false)).To(BeTrue(), "the resync of %s after the suspension", last.Secondary)
		if whole := f.Status.LastResync; whole != nil && !ptr.Deref(whole.Incremental, false) && whole.CopiedBytes != nil && last.CopiedBytes != nil {
			Expect(*last.CopiedBytes).To(BeNumerically("<", *whole.CopiedBytes))
			fmt.Printf("resync of the disks: whole %d bytes in %d ms (%s); incremental %d bytes in %d ms (%s)\n",
				*whole.CopiedBytes, ptr.Deref(whole.DurationMilliseconds, 0), whole.Secondary,
				*last.CopiedBytes, ptr.Deref(last.DurationMilliseconds, 0), last.Secondary)
		}
		expectServing(cl)
	})

	It("protection Disabled: the VM serves on alone; Enabled protects it again", func() {
		f := protected()
		if cl == nil { // focused alone: the client starts here
			cl = startClient(vmAddr)
		}
		p := *f.Status.Primary
		setProtection(ftv1.ProtectionDisabled)
		waitFor("protection off", time.Minute, func(f *ftv1.FaultTolerantVM) bool {
			c := apimeta.FindStatusCondition(f.Status.Conditions, ftv1.ConditionProtected)
			return f.Status.Secondary == nil && c != nil && c.Reason == ftv1.ReasonProtectionDisabled
		})
		expectServing(cl)
		setProtection(ftv1.ProtectionEnabled)
		Expect(protected().Status.Primary.UID).To(Equal(p.UID))
		expectServing(cl)
	})

	// A lockstepd restart ends the protection of its node's VMs (docs/colo.md); a rollout of its
	// DaemonSet (here a helm upgrade, as users upgrade) must not walk the VM through that on one
	// node after another while it is not protected again. The double is the kubelet of lockstepd's pods: it stops each with SIGTERM,
	// and sets the new one Ready from lockstepd's own readiness probe.
	It("rolls lockstepd out node by node, each node only once the VM is protected again: nothing lost, the unprotected time reported", func() {
		protected()
		if cl == nil { // focused alone (-ginkgo.focus='rolls lockstepd'): the client starts here
			cl = startClient(vmAddr)
		}
		rollout := lockstepdRollout{}
		rollout.observeFrom(time.Now())
		By("helm upgrade to a new image: lockstepd's pods are replaced one node at a time")
		out, err := lc.Run("helm", "upgrade", "lockstep", filepath.Join(lc.Root, "charts", "lockstep"), "-n", "lockstep-system",
			"--reset-then-reuse-values", "--set", "image.tag=rollout-test")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(kubectl("-n", "lockstep-system", "get", "daemonset/lockstepd", "-o", "jsonpath={.spec.template.spec.containers[0].image}")).
			To(HaveSuffix(":rollout-test"))
		rollout.until(10 * time.Minute)
		figures.Add("lockstepd rollout (4 nodes): image changed → every pod replaced and ready", rollout.took)
		figures.Add("lockstepd rollout (4 nodes): the VM unprotected, in all", rollout.unprotected)
		GinkgoWriter.Print(rollout.timeline())
		expectNoViolation(cl, rollout.timeline())
		Expect(rollout.replaced).To(HaveLen(nodes), "every node's lockstepd was replaced\n%s", rollout.timeline())
		Expect(rollout.unprotectedAtRestart).To(BeEmpty(),
			"a node's lockstepd was stopped before the VM was protected again, by a new secondary, after a restart on a node of its members\n%s", rollout.timeline())
		Expect(rollout.unprotected).To(BeNumerically(">", 0), "the restarts of its members' nodes ended the VM's protection, for a while\n%s", rollout.timeline())
		f := protected()
		expectOnePrimary()
		expectServing(cl)

		By("kubectl ftvm says the same as the status, from the API server")
		out = ftvmPlugin("status", ftvmName, "-n", "default")
		Expect(out).To(ContainSubstring("State:       Protected"))
		Expect(out).To(ContainSubstring(fmt.Sprintf("Secondary:   %s@%s (synchronized: yes)", f.Status.Secondary.VMI, f.Status.Secondary.Node)))
		Expect(ftvmPlugin("status", "-A")).To(MatchRegexp(`default\s+%s\s+Protected\s+%s@%s`, ftvmName, f.Status.Primary.VMI, f.Status.Primary.Node))
	})

	// Last: the seeded schedule of faults, on every part, with the client checking every reply.
	It("holds under a seeded schedule of faults: QEMU, lockstepd, the logging link, nodes and the operator killed", func() {
		if cl == nil { // focused alone (-ginkgo.focus='seeded schedule'): the client starts here
			protected()
			cl = startClient(vmAddr)
		}
		seed, steps := fullStackSchedule()
		schedule := chaos.FormatFullStack(seed, steps)
		GinkgoWriter.Print(schedule)
		fmt.Printf("full-stack chaos: seed %d, %d steps\n", seed, len(steps))
		before := getFTVM().Status.FailoverCount
		failovers := before
		for _, step := range steps {
			took := runFullStackStep(step)
			figures.Add(fmt.Sprintf("chaos step %d, %s: fault → Protected again", step.N, strings.TrimSpace(string(step.Action)+" "+step.Target)), took)
			expectNoViolation(cl, fmt.Sprintf("at or before step %d (seed %d)\n%s", step.N, seed, schedule))
			guest.check(fmt.Sprintf("chaos step %d (seed %d), %s", step.N, seed, step))
			now := getFTVM().Status.FailoverCount
			Expect(now).To(BeNumerically(">=", failovers), "the failover count went back\n%s", schedule)
			failovers = now
			expectServing(cl)
		}
		fmt.Printf("full-stack chaos: seed %d, %d steps: no violation; %d failovers; the client's last count %d\n",
			seed, len(steps), failovers-before, cl.Last().Count)
	})
})

func getFTVM() *ftv1.FaultTolerantVM {
	f := &ftv1.FaultTolerantVM{}
	ExpectWithOffset(1, k8s.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: ftvmName}, f)).To(Succeed())
	return f
}

func waitFor(what string, within time.Duration, ok func(*ftv1.FaultTolerantVM) bool) *ftv1.FaultTolerantVM {
	var last *ftv1.FaultTolerantVM
	EventuallyWithOffset(1, func() bool {
		f := &ftv1.FaultTolerantVM{}
		if k8s.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: ftvmName}, f) != nil {
			return false
		}
		last = f
		return ok(f)
	}, within, 200*time.Millisecond).Should(BeTrue(), func() string { return "waiting for " + what + "; last seen: " + describe(last) })
	return last
}

// protected waits until the VM is Protected with a synchronized secondary.
func protected() *ftv1.FaultTolerantVM {
	return waitFor("Protected", 5*time.Minute, isProtected)
}

// isProtected: Protected, with a secondary that lockstepd reports synchronized.
func isProtected(f *ftv1.FaultTolerantVM) bool {
	r := f.Status.Replication
	return f.Status.State == ftv1.StateProtected && f.Status.Primary != nil && f.Status.Secondary != nil &&
		r != nil && r.Secondary != nil && r.Secondary.VMI == f.Status.Secondary.VMI && r.Secondary.Synchronized
}

func describe(f *ftv1.FaultTolerantVM) string {
	if f == nil {
		return "nothing"
	}
	return conditions(f)
}

func conditions(f *ftv1.FaultTolerantVM) string {
	var b strings.Builder
	fmt.Fprintf(&b, "state %s", f.Status.State)
	for _, c := range f.Status.Conditions {
		fmt.Fprintf(&b, "; %s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message)
	}
	return b.String()
}

// recordHolder is who holds the pair's record (the Lease).
func recordHolder() string {
	var l coordinationv1.Lease
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: ftv1.RecordName(ftvmName)}, &l); err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// leaseEpoch is the pair's record's epoch (the Lease's leaseTransitions).
func leaseEpoch() int32 {
	var l coordinationv1.Lease
	ExpectWithOffset(1, k8s.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: ftv1.RecordName(ftvmName)}, &l)).To(Succeed())
	ExpectWithOffset(1, l.Spec.LeaseTransitions).NotTo(BeNil())
	return *l.Spec.LeaseTransitions
}

func memberExists(vmi string) bool {
	var v virtv1.VirtualMachineInstance
	err := k8s.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: vmi}, &v)
	return err == nil && v.DeletionTimestamp == nil
}

// expectOnePrimary checks that never more than one member is labelled primary, and that the
// operator soon labels exactly the record's holder (it relabels after lockstepd moved the record).
func expectOnePrimary() {
	deadline := time.Now().Add(time.Minute)
	for {
		var vmis virtv1.VirtualMachineInstanceList
		ExpectWithOffset(1, k8s.List(context.Background(), &vmis, ctrlclient.InNamespace("default"), ctrlclient.MatchingLabels{ftv1.LabelPair: ftvmName, ftv1.LabelRole: ftv1.RolePrimary})).To(Succeed())
		var live []string
		for _, v := range vmis.Items {
			if v.DeletionTimestamp == nil {
				live = append(live, ftv1.SideIdentity(v.Labels[ftv1.LabelNode], v.Name))
			}
		}
		ExpectWithOffset(1, len(live)).To(BeNumerically("<=", 1), "two members labelled primary: %v", live)
		holder := recordHolder()
		if len(live) == 1 && live[0] == holder {
			return
		}
		if time.Now().After(deadline) {
			Fail(fmt.Sprintf("the members labelled primary %v are not the record's holder %q a minute on", live, holder), 1)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nodeSchedulable says whether a node is Ready, not cordoned and free of the taints that keep
// members off it (a revived node may keep its unreachable taint a while).
func nodeSchedulable(name string) bool {
	var n corev1.Node
	if err := k8s.Get(context.Background(), types.NamespacedName{Name: name}, &n); err != nil || n.Spec.Unschedulable {
		return false
	}
	for _, t := range n.Spec.Taints {
		if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
			return false
		}
	}
	return nodeReady(name)
}

// vmWarnings are the operator's Warning events about the VM since since, oldest first, one per
// line: the failovers, restarts and fences that explain what the client saw.
func vmWarnings(since time.Time) string {
	var list eventsv1.EventList
	if err := k8s.List(context.Background(), &list, ctrlclient.InNamespace("default")); err != nil {
		return "(the events could not be listed: " + err.Error() + ")"
	}
	sort.Slice(list.Items, func(i, j int) bool { return eventTime(list.Items[i]).Before(eventTime(list.Items[j])) })
	var b strings.Builder
	for _, e := range list.Items {
		if e.Type == corev1.EventTypeWarning && e.Regarding.Name == ftvmName && !eventTime(e).Before(since) {
			fmt.Fprintf(&b, "  %s %s %s: %s\n", eventTime(e).Format("15:04:05"), e.Reason, e.Action, e.Note)
		}
	}
	if b.Len() == 0 {
		return "  (none)\n"
	}
	return b.String()
}

func eventTime(e eventsv1.Event) time.Time {
	if !e.EventTime.IsZero() {
		return e.EventTime.Time
	}
	return e.DeprecatedLastTimestamp.Time
}

// expectNoViolation: the client saw nothing that FT forbids; if it did, the VM's Warning events
// since the spec began say what the operator decided meanwhile.
func expectNoViolation(cl *client, extra ...string) {
	if cl == nil {
		return
	}
	v := cl.Violations()
	ExpectWithOffset(1, v).To(BeEmpty(), "the client saw what FT forbids; the VM's Warning events since %s:\n%s%s",
		specStart.Format("15:04:05"), vmWarnings(specStart), strings.Join(extra, ""))
}

// promotionNote is the note of the operator's event that promoted vmi ("" until there is one).
func promotionNote(vmi string) string {
	var list eventsv1.EventList
	if err := k8s.List(context.Background(), &list, ctrlclient.InNamespace("default")); err != nil {
		return ""
	}
	for _, e := range list.Items {
		if e.Reason == ftv1.ReasonPromoted && e.Regarding.Name == ftvmName && e.Related != nil && e.Related.Name == vmi {
			return e.Note
		}
	}
	return ""
}

func nodeReady(name string) bool {
	var n corev1.Node
	if err := k8s.Get(context.Background(), types.NamespacedName{Name: name}, &n); err != nil {
		return false
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// killNode kills the node's host (hack/local-cluster.sh kill-node) and returns the moment the
// KubeVirt double took it off the networks.
func killNode(name string) time.Time {
	return stamped(kubevirtdouble.KilledAtFile(lc.HostsDir(), name), "the double kills the host of "+name, "kill-node", name)
}

// stamped runs hack/local-cluster.sh with args and returns the moment the KubeVirt double stamped
// in file (Unix milliseconds) that it carried the fault out, waiting for a stamp newer than before.
func stamped(file, what string, args ...string) time.Time {
	before := stampIn(file)
	cluster(args...)
	var at time.Time
	EventuallyWithOffset(2, func() bool {
		at = stampIn(file)
		return at.After(before)
	}, 30*time.Second, 20*time.Millisecond).Should(BeTrue(), what)
	return at
}

func stampIn(file string) time.Time {
	b, err := os.ReadFile(file)
	if err != nil {
		return time.Time{}
	}
	ms, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return time.UnixMilli(ms)
}

// cutAPI cuts the node's host from the control plane (hack/local-cluster.sh cut-api) and returns
// the moment the KubeVirt double took its path to the API server away.
func cutAPI(name string) time.Time {
	return stamped(kubevirtdouble.CutAtFile(lc.HostsDir(), name), "the double cuts the host of "+name, "cut-api", name)
}

// cutAloneUntilRestarted cuts the node of primary p, which runs the VM alone, from the API server,
// with the client stopped after it acknowledged acked: p pauses (or, with mayStop, stops: a COLO
// primary with a secondary cannot pause) once it cannot renew the record, stops once its term
// ended, and only then does the VM run elsewhere, from disks that hold every acknowledged count;
// at no sample do two copies run; after the heal p stays stopped. It returns the client of the
// restarted VM.
func cutAloneUntilRestarted(guest *guestApps, what string, p ftv1.MemberStatus, acked counterReply, mayStop bool) *client {
	old := "default_" + p.VMI
	sampler := sampleDomains(old)
	Eventually(sampler.state, 30*time.Second, 100*time.Millisecond).Should(Equal("running"))
	cut := cutAPI(p.Node)
	if mayStop {
		Eventually(sampler.state, recordTermWait, 100*time.Millisecond).Should(BeElementOf("paused", "shut off", ""), "the primary pauses or stops once it cannot renew the record")
	} else {
		Eventually(sampler.state, recordTermWait, 100*time.Millisecond).Should(Equal("paused"), "the primary pauses once it cannot renew the record")
		figures.Add(what+": cut → its VM paused", time.Since(cut))
	}
	Eventually(sampler.state, time.Minute, 100*time.Millisecond).Should(Or(BeEmpty(), Equal("shut off")),
		"its QEMU stops once its term ran out: a paused one would keep the VM's disks from the copy that starts elsewhere")
	figures.Add(what+": cut → its VM stopped", time.Since(cut))
	restarted := waitFor("the VM restarted on another node", 5*time.Minute, func(f *ftv1.FaultTolerantVM) bool {
		return f.Status.Primary != nil && f.Status.Primary.VMI != p.VMI && f.Status.Primary.Node != p.Node &&
			apimeta.IsStatusConditionTrue(f.Status.Conditions, ftv1.ConditionPrimaryReady)
	})
	figures.Add(what+": cut → the VM running elsewhere", time.Since(cut))
	cl := startClient(vmAddr)
	asked := time.Now()
	Eventually(func() bool { _, a := cl.Around(asked); return !a.At.IsZero() }, 3*time.Minute, 100*time.Millisecond).
		Should(BeTrue(), "the restarted VM answers the client once its guest booted")
	_, first := cl.Around(asked)
	Expect(first.Count).To(BeNumerically(">", acked.Count), "every count acknowledged before the cut was on the disk the VM restarted from")
	Expect(first.Disk).To(Equal(first.Count))
	guest.restarted() // the check after this spec proves every acknowledged transfer survived
	By("the old member, on a node still cut, goes (its QEMU stopped long before)")
	Eventually(func() bool {
		err := k8s.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: p.VMI}, &virtv1.VirtualMachineInstance{})
		return apierrors.IsNotFound(err)
	}, 2*time.Minute, 500*time.Millisecond).Should(BeTrue(), "KubeVirt finishes the old member's VMI once its launcher pod is gone")
	By("the node's path heals: the old primary stays stopped")
	healAPI(p.Node)
	Consistently(sampler.state, 5*time.Second, 200*time.Millisecond).Should(Or(BeEmpty(), Equal("shut off")))
	samples, violations := sampler.stop()
	Expect(violations).To(BeEmpty())
	Expect(samples).To(BeNumerically(">", 20), "the sampler looked often enough to see two copies")
	// The healed member never runs the VM again. (The restarted pair may have failed over
	// meanwhile: a busy host can make both its sides miss each other's heartbeats at once, and
	// one of them wins the record.)
	now := getFTVM()
	Expect(now.Status.Primary).NotTo(BeNil())
	Expect(now.Status.Primary.VMI).NotTo(Equal(p.VMI))
	Expect(now.Status.Primary.Node).NotTo(Equal(p.Node))
	if now.Status.Primary.VMI != restarted.Status.Primary.VMI {
		Expect(now.Status.FailoverCount).To(BeNumerically(">", restarted.Status.FailoverCount), "the primary changed only by a failover")
	}
	expectOnePrimary()
	return cl
}

// skewClock sets the node's host's clock seconds off (hack/local-cluster.sh skew-clock) and waits
// until its restarted lockstepd renews its node lease on that clock.
func skewClock(name string, seconds int) {
	cluster("skew-clock", name, strconv.Itoa(seconds))
	want := time.Duration(seconds) * time.Second
	EventuallyWithOffset(1, func() time.Duration {
		var l coordinationv1.Lease
		if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: "lockstep-system", Name: ftv1.NodeLeaseName(name)}, &l); err != nil || l.Spec.RenewTime == nil {
			return time.Hour
		}
		// A renewal on the host's clock is about seconds off from now on this one (renewals
		// come every 10 s).
		return (time.Until(l.Spec.RenewTime.Time) - want).Abs()
	}, 2*time.Minute, time.Second).Should(BeNumerically("<", 15*time.Second), "lockstepd of %s renews its node lease on a clock %ds off", name, seconds)
}

// freeNode is a schedulable node other than those given.
func freeNode(not ...string) string {
	target := ""
	EventuallyWithOffset(1, func() string {
		for i := 1; i <= nodes; i++ {
			if n := nodeName(i); !slices.Contains(not, n) && nodeSchedulable(n) {
				target = n
			}
		}
		return target
	}, time.Minute, 200*time.Millisecond).ShouldNot(BeEmpty(), "a node that can take a member")
	return target
}

// healAPI gives the node's host its path to the API server back and waits until it is Ready.
func healAPI(name string) {
	cluster("heal-api", name)
	EventuallyWithOffset(1, func() bool { return nodeReady(name) }, 2*time.Minute, 200*time.Millisecond).Should(BeTrue())
}

// expectSamePair: the VM's status names primary p and secondary s, and its failover count is
// failovers (nothing moved).
func expectSamePair(g Gomega, f *ftv1.FaultTolerantVM, p, s ftv1.MemberStatus, failovers int32) {
	g.Expect(f.Status.Primary).NotTo(BeNil())
	g.Expect(f.Status.Primary.VMI).To(Equal(p.VMI))
	g.Expect(f.Status.Secondary).NotTo(BeNil())
	g.Expect(f.Status.Secondary.VMI).To(Equal(s.VMI))
	g.Expect(f.Status.FailoverCount).To(Equal(failovers))
}

// recordRenewal is who wrote the pair's record last (its renewed-by annotation) and its renew time.
func recordRenewal() (string, time.Time) {
	var l coordinationv1.Lease
	ExpectWithOffset(1, k8s.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: ftv1.RecordName(ftvmName)}, &l)).To(Succeed())
	var at time.Time
	if l.Spec.RenewTime != nil {
		at = l.Spec.RenewTime.Time
	}
	return l.Annotations[ftv1.AnnotationRenewedBy], at
}

// reviveNode brings the node back (an empty host) and waits until it is Ready and its lockstepd
// serves again.
func reviveNode(name string) {
	cluster("revive-node", name)
	EventuallyWithOffset(1, func() bool { return nodeReady(name) }, 2*time.Minute, 200*time.Millisecond).Should(BeTrue())
}

// waitReplyAfter waits for the client's first reply after t.
func waitReplyAfter(cl *client, t time.Time) (before, after counterReply) {
	EventuallyWithOffset(1, func() bool {
		_, a := cl.Around(t)
		return !a.At.IsZero()
	}, time.Minute, 20*time.Millisecond).Should(BeTrue(), "the VM answers the client again")
	return cl.Around(t)
}

func runOperation(name string, typ ftv1.OperationType, node string) {
	ExpectWithOffset(1, k8s.Create(context.Background(), &ftv1.FaultTolerantVMOperation{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec:       ftv1.FaultTolerantVMOperationSpec{FaultTolerantVMName: ftvmName, Type: typ, Node: node},
	})).To(Succeed())
}

// waitOperation waits until the operation Succeeded.
func waitOperation(name string) *ftv1.FaultTolerantVMOperation {
	op := &ftv1.FaultTolerantVMOperation{}
	EventuallyWithOffset(1, func(g Gomega) {
		g.Expect(k8s.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: name}, op)).To(Succeed())
		g.Expect(op.Status.Phase).To(Equal(ftv1.OperationSucceeded), "%s: %s", op.Status.Phase, op.Status.Message)
	}, 5*time.Minute, 200*time.Millisecond).Should(Succeed())
	return op
}

func setProtection(p ftv1.Protection) {
	f := getFTVM()
	base := f.DeepCopy()
	f.Spec.Protection = p
	ExpectWithOffset(1, k8s.Patch(context.Background(), f, ctrlclient.MergeFrom(base))).To(Succeed())
}

// expectServing checks that the VM answers the client a few more times.
func expectServing(cl *client) {
	n := cl.Count()
	EventuallyWithOffset(1, cl.Count, time.Minute, 100*time.Millisecond).Should(BeNumerically(">=", n+3), "the VM answers the client")
}

// lockstepdRollout watches a rollout of lockstepd's DaemonSet: every 200 ms, the VM's status and
// lockstepd's pods. A restart of lockstepd on a node that holds a member of the VM ends the
// protection the VM had with its secondary then; the rollout must not stop the next node's
// lockstepd before the VM is Protected again, by another secondary.
type lockstepdRollout struct {
	old map[types.UID]string // the pods before the rollout: UID -> node
	// replaced: node -> when its old pod was first seen deleted; unprotectedAtRestart: the nodes
	// whose old pod went while the VM was not protected again after an earlier restart, or at
	// once with the other member's node's.
	replaced             map[string]time.Time
	unprotectedAtRestart []string
	unprotected, took    time.Duration
	start                time.Time
	events               []string
}

func (r *lockstepdRollout) observeFrom(start time.Time) {
	r.start, r.old, r.replaced = start, map[types.UID]string{}, map[string]time.Time{}
	for _, p := range lockstepdPods() {
		r.old[p.UID] = p.Spec.NodeName
		if !podReady(&p) {
			// The DaemonSet controller deletes an old pod that is not ready at once, beside the
			// one its maxUnavailable allows.
			r.note(start, fmt.Sprintf("lockstepd's old pod on %s is not ready as the rollout starts", p.Spec.NodeName))
		}
	}
	Expect(r.old).To(HaveLen(nodes), "one lockstepd pod on each node before the rollout")
}

// until follows the rollout until every old pod is gone and a new one on each node is ready.
func (r *lockstepdRollout) until(within time.Duration) {
	wasProtected, last := true, time.Now()
	// cutOff: the secondary whose protection the last restart on a member's node ended ("": the
	// VM has been protected again since, or no restart touched it yet).
	cutOff := ""
	deadline := time.Now().Add(within)
	for {
		now := time.Now()
		f := getFTVM()
		prot := apimeta.IsStatusConditionTrue(f.Status.Conditions, ftv1.ConditionProtected)
		sec, members := "", map[string]bool{}
		for _, m := range []*ftv1.MemberStatus{f.Status.Primary, f.Status.Secondary} {
			if m != nil {
				members[m.Node] = true
			}
		}
		if f.Status.Secondary != nil {
			sec = f.Status.Secondary.VMI
		}
		if !wasProtected {
			r.unprotected += now.Sub(last)
		}
		if prot != wasProtected {
			r.note(now, fmt.Sprintf("the VM %s (%s)", map[bool]string{true: "is Protected again", false: "is not Protected"}[prot], conditions(f)))
		}
		if cutOff != "" && prot && sec != cutOff {
			cutOff = ""
		}
		live := map[types.UID]bool{}
		readyNew := 0
		for _, p := range lockstepdPods() {
			if p.DeletionTimestamp == nil {
				live[p.UID] = true
			}
			if _, old := r.old[p.UID]; !old && p.DeletionTimestamp == nil && podReady(&p) {
				readyNew++
			}
		}
		// The pods seen deleted in one sample went together: each is judged by what the VM was
		// before them (a restart already under way), and a member's node also by the other
		// members' nodes among them (the VM's two sides' lockstepd restarted at once).
		var gone []string
		for uid, node := range r.old {
			if _, seen := r.replaced[node]; !seen && !live[uid] {
				gone = append(gone, node)
			}
		}
		sort.Strings(gone)
		membersGone := 0
		for _, node := range gone {
			if members[node] {
				membersGone++
			}
		}
		for _, node := range gone {
			r.replaced[node] = now
			r.note(now, fmt.Sprintf("lockstepd's old pod on %s is deleted (the VM's members on %v, secondary %s)", node, members, sec))
			if cutOff != "" || members[node] && membersGone > 1 {
				r.unprotectedAtRestart = append(r.unprotectedAtRestart, node)
			}
		}
		if membersGone > 0 {
			cutOff = sec
		}
		wasProtected, last = prot, now
		if len(r.replaced) == len(r.old) && readyNew == len(r.old) && prot && cutOff == "" {
			r.took = now.Sub(r.start)
			return
		}
		Expect(now.Before(deadline)).To(BeTrue(), "the rollout did not end within %s\n%s", within, r.timeline())
		time.Sleep(200 * time.Millisecond)
	}
}

func (r *lockstepdRollout) note(at time.Time, what string) {
	r.events = append(r.events, fmt.Sprintf("%7.1fs %s", at.Sub(r.start).Seconds(), what))
}

func (r *lockstepdRollout) timeline() string {
	return "lockstepd rollout:\n  " + strings.Join(r.events, "\n  ") + "\n"
}

func lockstepdPods() []corev1.Pod {
	var pods corev1.PodList
	ExpectWithOffset(1, k8s.List(context.Background(), &pods, ctrlclient.InNamespace("lockstep-system"),
		ctrlclient.MatchingLabels{"app.kubernetes.io/component": "lockstepd"})).To(Succeed())
	return pods.Items
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// ftvmPlugin runs the kubectl plugin (bin/kubectl-ftvm, which hack/local-cluster.sh builds)
// against the cluster.
func ftvmPlugin(args ...string) string {
	kc, err := lc.Kubeconfig()
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	out, err := exec.Command("../../bin/kubectl-ftvm", append(args, "--kubeconfig", kc)...).CombinedOutput()
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "kubectl ftvm %v: %s", args, out)
	return string(out)
}
