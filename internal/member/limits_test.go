package member

import (
	"testing"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

func TestLogBandwidthFollowsTheEngine(t *testing.T) {
	load := &ftv1.ExpectedLoad{DiskReadMBps: 10, NetworkReceiveMbps: 20, MemoryDirtyMBps: 30, DiskWriteMBps: 5, NetworkTransmitMbps: 50}
	ftvm := &ftv1.FaultTolerantVM{Spec: ftv1.FaultTolerantVMSpec{ExpectedLoad: load}}
	if got := LogBandwidthMbps(ftvm, 100, true); got != 420 { // ((30+5)*8 + 20 + 50) * 1.2
		t.Errorf("with COLO: %d Mbit/s, want 420", got)
	}
	if got := LogBandwidthMbps(ftvm, 100, false); got != 120 { // (10*8 + 20) * 1.2
		t.Errorf("without COLO: %d Mbit/s, want 120", got)
	}
	load.MemoryDirtyMBps = 0 // ((0+5)*8 + 20 + 50) * 1.2 = 132
	if got := LogBandwidthMbps(ftvm, 100, true); got != 132 {
		t.Errorf("with COLO, no dirtied memory given but more than the default: %d Mbit/s, want 132", got)
	}
	ftvm.Spec.ExpectedLoad = &ftv1.ExpectedLoad{DiskReadMBps: 10, NetworkReceiveMbps: 20} // the white paper's fields alone
	if got := LogBandwidthMbps(ftvm, 100, true); got != 100 {
		t.Errorf("with COLO, no dirtied memory given: %d Mbit/s, want no less than the default 100", got)
	}
	ftvm.Spec.ExpectedLoad = nil
	if got := LogBandwidthMbps(ftvm, 100, true); got != 100 {
		t.Errorf("without an expected load: %d Mbit/s, want the default 100", got)
	}
}
