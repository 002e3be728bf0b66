package validation

import (
	"slices"
	"strings"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// ExpectedLoadWarnings names the fields of spec.expectedLoad that size nothing for the members the
// operator runs: with COLO, a guest's disk reads (each member reads its own disks); without it,
// what only COLO sends (dirtied memory, disk writes, the transmitted copy compared). With COLO it
// also says when the load gives no dirtied memory, which the reservation then makes up for.
func ExpectedLoadWarnings(ftvm *ftv1.FaultTolerantVM, colo bool) []string {
	l := ftvm.Spec.ExpectedLoad
	if l == nil {
		return nil
	}
	if colo {
		var w []string
		if l.DiskReadMBps > 0 {
			w = append(w, "spec.expectedLoad.diskReadMBps sizes nothing with COLO members, which read their own disks: the logging bandwidth reserved counts memoryDirtyMBps, diskWriteMBps, networkReceiveMbps and networkTransmitMbps")
		}
		if l.MemoryDirtyMBps == 0 {
			w = append(w, "spec.expectedLoad gives no memoryDirtyMBps: every COLO checkpoint carries the memory the guest dirtied, so the VM reserves no less than the operator's default per-VM logging bandwidth (--default-vm-log-bandwidth-mbps); measure it with virsh domdirtyrate-calc on the VM unprotected")
		}
		return w
	}
	var unused []string
	for name, v := range map[string]int32{"diskWriteMBps": l.DiskWriteMBps, "memoryDirtyMBps": l.MemoryDirtyMBps, "networkTransmitMbps": l.NetworkTransmitMbps} {
		if v > 0 {
			unused = append(unused, name)
		}
	}
	if len(unused) == 0 {
		return nil
	}
	slices.Sort(unused)
	return []string{"spec.expectedLoad." + strings.Join(unused, ", spec.expectedLoad.") + " size nothing without COLO members: the logging bandwidth reserved counts diskReadMBps and networkReceiveMbps (the white paper's formula)"}
}
