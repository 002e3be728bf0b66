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
	d := pairCounts{tcp: map[string]int64{}, checkpoints: a.checkpoints - before.checkpoints, causes: colo.Causes{
		Mismatch: a.causes.Mismatch - before.causes.Mismatch,
		Timeout:  a.causes.Timeout - before.causes.Timeout,
		Unparsed: a.causes.Unparsed - before.causes.Unparsed,
		Crossed:  a.causes.Crossed - before.causes.Crossed,
		Held:     a.causes.Held - before.causes.Held,
	}}
	for name, n := range a.tcp {
		d.tcp[name] = n - before.tcp[name]
	}
	return d
}
