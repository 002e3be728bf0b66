package member

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/placement"
)

// NodeLimits is a node's FT limit: the cluster's defaults, overridden by the node's annotations
// (ft.lockstep.dev/max-ft-vms, max-ft-vcpus, log-bandwidth-mbps). It also returns the
// annotations it ignored because they are not whole numbers of zero or more.
func NodeLimits(defaults placement.Limits, n *corev1.Node) (placement.Limits, []string) {
	l := defaults
	var ignored []string
	override := func(key string, into *int) {
		raw, ok := n.Annotations[key]
		if !ok {
			return
		}
		v, err := strconv.Atoi(raw)
		if err != nil || v < 0 {
			ignored = append(ignored, key)
			return
		}
		*into = v
	}
	override(ftv1.AnnotationNodeMaxVMs, &l.MaxMembers)
	override(ftv1.AnnotationNodeMaxVCPUs, &l.MaxVCPUs)
	override(ftv1.AnnotationNodeLogBandwidth, &l.LogBandwidthMbps)
	return l, ignored
}

// LogBandwidthMbps is the logging bandwidth reserved for the VM on each member's node: over
// spec.expectedLoad, lockstep's formula for COLO members (colo) or else the white paper's (2.10);
// defaultMbps without it. A COLO VM whose load gives no memoryDirtyMBps reserves no less than
// defaultMbps: every checkpoint carries the memory its guest dirtied, which the formula would
// count as none.
func LogBandwidthMbps(ftvm *ftv1.FaultTolerantVM, defaultMbps int, colo bool) int {
	l := ftvm.Spec.ExpectedLoad
	switch {
	case l == nil:
		return defaultMbps
	case colo:
		mbps := placement.COLOLogBandwidthMbps(int(l.MemoryDirtyMBps), int(l.DiskWriteMBps), int(l.NetworkReceiveMbps), int(l.NetworkTransmitMbps))
		if l.MemoryDirtyMBps == 0 {
			return max(mbps, defaultMbps)
		}
		return mbps
	default:
		return placement.LogBandwidthMbps(int(l.DiskReadMBps), int(l.NetworkReceiveMbps))
	}
}
