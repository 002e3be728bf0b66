// Package scale runs lockstep at size on a local cluster of hack/local-cluster.sh (kwok nodes, the
// KubeVirt double): FaultTolerantVMs of mixed sizes on nodes with zones and per-node FT limits,
// more of them than the cluster can hold (deleted again, to leave room for failures), then a
// tenth of the nodes killed at once. Throughout, a
// monitor watches every member and node and records each broken invariant; at the end of each
// phase every FaultTolerantVM must be Protected, or waiting with no room for it anywhere.
//
//	make test-scale    # 200 FTVMs (and 40 more, deleted again) on 50 nodes: the invariants, in make test
//	make bench-scale   # 1,000 FTVMs (and 200 more, deleted again) on 500 nodes: the figures
//
// This file is the pure part: whether the cluster has room for a FaultTolerantVM that waits.
package scale

import "fmt"

// nodeRoom is a node as the scale test sees it.
type nodeRoom struct {
	Name string
	// Open: Ready, and without a NoSchedule or NoExecute taint (a node that died has both).
	Open bool
	// MaxMembers and MaxVCPUs are its FT limit: the operator's defaults or its annotations.
	MaxMembers, MaxVCPUs int
	// Members and VCPUs are what the members on it (not yet finished) use.
	Members, VCPUs int
}

func (n nodeRoom) fits(vcpus int) bool {
	return n.Open && n.Members+1 <= n.MaxMembers && n.VCPUs+vcpus <= n.MaxVCPUs
}

// waitingVM is a FaultTolerantVM that is not Protected.
type waitingVM struct {
	Name  string
	VCPUs int
	// PrimaryNode is the node of its running primary; "" when it has none.
	PrimaryNode string
}

// roomFor says where the cluster has room for what the VM lacks ("" when nowhere): a node for a
// secondary other than its primary's, or two nodes for a new pair. The logging bandwidth budget
// is left out: at the operator's defaults (1000 Mbit/s a node, 100 a VM) it allows ten members
// a node, more than any node's limit here.
func roomFor(w waitingVM, nodes []nodeRoom) string {
	var fit []string
	for _, n := range nodes {
		if n.Name != w.PrimaryNode && n.fits(w.VCPUs) {
			fit = append(fit, n.Name)
		}
	}
	switch {
	case w.PrimaryNode != "" && len(fit) >= 1:
		return fmt.Sprintf("a secondary fits on %s", fit[0])
	case w.PrimaryNode == "" && len(fit) >= 2:
		return fmt.Sprintf("a pair fits on %s and %s", fit[0], fit[1])
	}
	return ""
}
