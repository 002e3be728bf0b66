//go:build linux && vmtier

package vmtier

import (
	"testing"

	"github.com/lockstep-dev/lockstep/internal/colo"
)

// pairCounts is what a test counts of a protected pair around a stretch of load: the client's
// TCP counters (clientTCPCounters), the checkpoints the secondary took, and the checkpoints
// colo-compare asked for and why.
type pairCounts struct {
	tcp         map[string]int64
	checkpoints int
	causes      colo.Causes
}

// countPair reads the counts of the pair whose primary is p and secondary s, and of c's client.
func countPair(t *testing.T, c *cluster, p, s *member) pairCounts {
	t.Helper()
	return pairCounts{tcp: clientTCPCounters(t, c.client), checkpoints: checkpointsOf(t, s), causes: causesOf(t, p)}
}

// since is what was counted between before and a.
func (a pairCounts) since(before pairCounts) pairCounts {
	return pairCounts{tcp: countersSince(a.tcp, before.tcp), checkpoints: a.checkpoints - before.checkpoints, causes: causesSince(a.causes, before.causes)}
}

// causesSince is what colo-compare counted between before and after, cause by cause.
func causesSince(after, before colo.Causes) colo.Causes {
	return colo.Causes{
		Mismatch: after.Mismatch - before.Mismatch,
		Timeout:  after.Timeout - before.Timeout,
		Unparsed: after.Unparsed - before.Unparsed,
		Crossed:  after.Crossed - before.Crossed,
		Held:     after.Held - before.Held,
	}
}
