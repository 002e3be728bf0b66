package chaos

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// The full-stack schedule faults the parts of one protected VM on the full-stack tier
// (test/fullstack): its QEMUs, the lockstepd beside them, its logging link, its nodes and the
// operator. A step names a role ("primary" or "secondary"), not a node: which node holds which
// member changes with every failover, and the runner resolves it when the step runs. After each
// step the runner waits until the VM is Protected again, so every step starts from a whole pair.
const (
	KillQEMU         Action = "kill-qemu"         // the member's QEMU dies (SIGKILL)
	KillLockstepd    Action = "kill-lockstepd"    // the lockstepd on the member's node dies; the kubelet starts it again
	PartitionLogging Action = "partition-logging" // the member's node loses its logging link for Hold
	KillMemberNode   Action = "kill-member-node"  // the member's node dies (revived once the VM is Protected again)
	CutAPI           Action = "cut-api"           // the member's node is cut from the control plane for Hold (hack/local-cluster.sh cut-api)
	SkewClock        Action = "skew-clock"        // the member's node's clock goes Skew off, and stays so (hack/local-cluster.sh skew-clock)
)

// FullStackFaults are the faults a full-stack schedule draws beyond those it always drew: a seed
// without them draws the schedule it drew before they were added.
type FullStackFaults struct {
	// CutAPI: a member's node cut from the control plane for a while.
	CutAPI bool
	// ClockSkew: a member's node's clock set one to four minutes off, either way.
	ClockSkew bool
}

// The roles a full-stack step targets.
const (
	TargetPrimary   = "primary"
	TargetSecondary = "secondary"
)

// FullStackSchedule draws steps from seed: every action of the full-stack tier, against either
// member, with the operator's kills among them, and the faults asked for.
func FullStackSchedule(seed uint64, steps int, faults FullStackFaults) []Step {
	r := rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d))
	skews := rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))
	role := func() string {
		if r.IntN(2) == 0 {
			return TargetPrimary
		}
		return TargetSecondary
	}
	hold := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(r.Int64N(int64(hi-lo))) }
	out := make([]Step, 0, steps)
	for len(out) < steps {
		var s Step
		x := r.IntN(100)
		if !faults.CutAPI {
			x = withoutCutAPI(x)
		}
		switch {
		case x < 25:
			s = Step{Action: KillQEMU, Target: role()}
		case x < 40:
			s = Step{Action: KillLockstepd, Target: role()}
		case x < 55:
			s = Step{Action: PartitionLogging, Target: role(), Hold: hold(2*time.Second, 10*time.Second)}
		case x < 70:
			s = Step{Action: KillMemberNode, Target: role()}
		case x < 88:
			// Shorter than the node-lost grace, and longer than the record's term and the
			// operator's wait after it.
			s = Step{Action: CutAPI, Target: role(), Hold: hold(5*time.Second, 45*time.Second)}
		default:
			s = Step{Action: KillOperator, Hold: hold(500*time.Millisecond, 5*time.Second)}
		}
		// From a stream of its own, so that asking for it changes only the steps it takes.
		if faults.ClockSkew && skews.IntN(100) < 12 {
			skew := time.Minute + time.Duration(skews.Int64N(int64(3*time.Minute))).Truncate(time.Second)
			if skews.IntN(2) == 0 {
				skew = -skew
			}
			s = Step{Action: SkewClock, Target: TargetPrimary, Skew: skew}
			if skews.IntN(2) == 0 {
				s.Target = TargetSecondary
			}
		}
		s.N = len(out) + 1
		out = append(out, s)
	}
	return out
}

// withoutCutAPI maps a draw of the schedule's bands onto the bands it had before cut-api took
// its share (kill-qemu below 25, kill-lockstepd below 45, partition-logging below 65,
// kill-member-node below 85, kill-operator above), for the band each action has now.
func withoutCutAPI(x int) int {
	switch {
	case x < 25:
		return x
	case x < 45:
		return 25 + (x-25)*15/20 // kill-lockstepd: 25..39
	case x < 65:
		return 40 + (x-45)*15/20 // partition-logging: 40..54
	case x < 85:
		return 55 + (x-65)*15/20 // kill-member-node: 55..69
	default:
		return 88 + (x-85)*12/15 // kill-operator: 88..99
	}
}

// FormatFullStack is a full-stack schedule as printed in a report: the seed and steps that repeat it.
func FormatFullStack(seed uint64, steps []Step) string {
	var b strings.Builder
	fmt.Fprintf(&b, "full-stack chaos schedule, seed %d (FULLSTACK_CHAOS_SEED=%d FULLSTACK_CHAOS_STEPS=%d make test-fullstack repeats it):\n", seed, seed, len(steps))
	writeSteps(&b, steps)
	return b.String()
}
