//go:build fullstack

package fullstack

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/test/chaos"
	"github.com/lockstep-dev/lockstep/test/kubevirtdouble"
)

// The full-stack chaos schedule: FULLSTACK_CHAOS_SEED (default: the clock) and
// FULLSTACK_CHAOS_STEPS (default 6) choose it (test/chaos.FullStackSchedule).
func fullStackSchedule() (uint64, []chaos.Step) {
	seed, n, err := chaos.FromEnv("FULLSTACK_CHAOS_SEED", "FULLSTACK_CHAOS_STEPS", uint64(time.Now().UnixNano()%1_000_000), 6)
	Expect(err).NotTo(HaveOccurred())
	// cut-api and skew-clock are drawn unless FULLSTACK_CHAOS_CUT_API=0 or
	// FULLSTACK_CHAOS_CLOCK_SKEW=0 (a seed then draws the schedule it drew before they were added).
	return seed, chaos.FullStackSchedule(seed, n, chaos.FullStackFaults{
		CutAPI:    os.Getenv("FULLSTACK_CHAOS_CUT_API") != "0",
		ClockSkew: os.Getenv("FULLSTACK_CHAOS_CLOCK_SKEW") != "0",
	})
}

// runFullStackStep carries out one step against the pair as it stands, waits until the VM is
// Protected again with one primary, the record's holder, and brings back a node it killed. It
// returns how long the VM took to be Protected again.
func runFullStackStep(step chaos.Step) time.Duration {
	f := protected()
	m := *f.Status.Primary
	if step.Target == chaos.TargetSecondary {
		m = *f.Status.Secondary
	}
	By(fmt.Sprintf("%s: %s on %s", step, m.VMI, m.Node))
	start := time.Now()
	revive := ""
	switch step.Action {
	case chaos.KillQEMU:
		Expect(syscall.Kill(qemuPID(m.VMI), syscall.SIGKILL)).To(Succeed())
	case chaos.KillLockstepd:
		old := lockstepdPID(m.Node)
		Expect(syscall.Kill(old, syscall.SIGKILL)).To(Succeed())
		Eventually(func() int { return lockstepdPIDOrZero(m.Node) }, time.Minute, 100*time.Millisecond).
			Should(And(Not(BeZero()), Not(Equal(old))), "the kubelet (the double) starts lockstepd on %s again", m.Node)
	case chaos.PartitionLogging:
		cluster("partition-node", m.Node)
		time.Sleep(step.Hold)
		cluster("heal-node", m.Node)
	case chaos.KillMemberNode:
		start = killNode(m.Node)
		revive = m.Node
	case chaos.CutAPI:
		cutAPI(m.Node)
		time.Sleep(step.Hold)
		healAPI(m.Node)
	case chaos.SkewClock:
		skewClock(m.Node, int(step.Skew.Seconds()))
	case chaos.KillOperator:
		cluster("kill", "operator")
		time.Sleep(step.Hold)
		cluster("start", "operator")
	default:
		Fail("no full-stack step " + string(step.Action))
	}
	if step.Action == chaos.KillQEMU || step.Action == chaos.KillMemberNode {
		// Its member is lost: wait until it goes, so that the old pair is not taken for the new.
		Eventually(memberExists, 2*time.Minute, 100*time.Millisecond).WithArguments(m.VMI).Should(BeFalse(), "%s goes", m.VMI)
	}
	// Protected, on reports that both sides' lockstepd made after the fault ended: a status
	// written before it (a restarted lockstepd's, a healed link's) does not count.
	again := protectedAfter(time.Now())
	took := time.Since(start)
	expectOnePrimary()
	Expect(ftv1.SideIdentity(again.Status.Primary.Node, again.Status.Primary.VMI)).To(Equal(recordHolder()))
	if revive != "" {
		reviveNode(revive)
	}
	return took
}

// qemuPID is the pid of the QEMU that runs member vmi: the one whose guest name is the domain's
// (the double names domains <namespace>_<vmi>, as KubeVirt does).
func qemuPID(vmi string) int {
	found := qemuPIDs(vmi)
	ExpectWithOffset(1, found).To(HaveLen(1), "the QEMU of %s", vmi)
	return found[0]
}

// qemuPIDs are the pids of the QEMUs whose guest name is member vmi's domain.
func qemuPIDs(vmi string) []int {
	want := "guest=default_" + vmi + ","
	var found []int
	entries, err := os.ReadDir("/proc")
	Expect(err).NotTo(HaveOccurred())
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmd), "qemu-system") {
			continue
		}
		if strings.Contains(strings.ReplaceAll(string(cmd), "\x00", " "), want) {
			found = append(found, pid)
		}
	}
	return found
}

// protectedAfter waits until the VM is Protected with a synchronized secondary, on reports of
// both sides made after t (report times have whole seconds), and both members' QEMUs run. The
// status alone is not enough: while a killed operator waits for its leader lease (about 15 s),
// the state it wrote before the fault stands, and the next fault would find the pair not whole.
func protectedAfter(t time.Time) *ftv1.FaultTolerantVM {
	after := t.Truncate(time.Second).Add(time.Second)
	return waitFor("Protected, on reports made after the fault, with both members' QEMUs running", 5*time.Minute, func(f *ftv1.FaultTolerantVM) bool {
		r := f.Status.Replication
		return isProtected(f) && r.Primary != nil && r.Primary.VMI == f.Status.Primary.VMI &&
			!onThisClock(r.Primary).Before(after) && !onThisClock(r.Secondary).Before(after) &&
			len(qemuPIDs(f.Status.Primary.VMI)) == 1 && len(qemuPIDs(f.Status.Secondary.VMI)) == 1 &&
			memberExists(f.Status.Primary.VMI) && memberExists(f.Status.Secondary.VMI)
	})
}

// onThisClock is when a side's report was written, on the test's clock: its lockstepd wrote it
// on its node's, which skew-clock may have set off.
func onThisClock(side *ftv1.SideStatus) time.Time {
	return side.ReportTime.Add(-clockSkew(side.Node))
}

// clockSkew is how far the node's host's clock is set off (hack/local-cluster.sh skew-clock).
func clockSkew(node string) time.Duration {
	skew, err := kubevirtdouble.ClockSkew(lc.HostsDir(), node)
	ExpectWithOffset(2, err).NotTo(HaveOccurred())
	return skew
}

// lockstepdPID is the pid of the lockstepd on node's host.
func lockstepdPID(node string) int {
	pid := lockstepdPIDOrZero(node)
	ExpectWithOffset(1, pid).NotTo(BeZero(), "the lockstepd on %s", node)
	return pid
}

// lockstepdPIDOrZero is the pid of the lockstepd on node's host, 0 when none runs.
func lockstepdPIDOrZero(node string) int {
	out, err := exec.Command("ip", "netns", "pids", kubevirtdouble.NodeNS(clusterName, node)).Output()
	if err != nil {
		return 0
	}
	var found []int
	for _, f := range strings.Fields(string(out)) {
		comm, err := os.ReadFile(filepath.Join("/proc", f, "comm"))
		if err == nil && strings.TrimSpace(string(comm)) == "lockstepd" {
			pid, _ := strconv.Atoi(f)
			found = append(found, pid)
		}
	}
	if len(found) != 1 {
		return 0 // none, or the old one not yet reaped beside the new
	}
	return found[0]
}
