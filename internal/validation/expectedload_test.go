package validation

import (
	"strings"
	"testing"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

func TestExpectedLoadWarnsOfWhatSizesNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		load *ftv1.ExpectedLoad
		colo bool
		want []string // each in the one warning; none: no warning
	}{
		{"no load", nil, true, nil},
		{"COLO: what COLO sends", &ftv1.ExpectedLoad{MemoryDirtyMBps: 20, DiskWriteMBps: 5, NetworkReceiveMbps: 10, NetworkTransmitMbps: 10}, true, nil},
		{"COLO: disk reads", &ftv1.ExpectedLoad{DiskReadMBps: 10, NetworkReceiveMbps: 20, MemoryDirtyMBps: 1}, true, []string{"diskReadMBps sizes nothing with COLO"}},
		{"COLO: no dirtied memory", &ftv1.ExpectedLoad{NetworkReceiveMbps: 20}, true, []string{"no memoryDirtyMBps", "no less than the operator's default"}},
		{"without COLO: the white paper's", &ftv1.ExpectedLoad{DiskReadMBps: 10, NetworkReceiveMbps: 20}, false, nil},
		{"without COLO: COLO's fields", &ftv1.ExpectedLoad{MemoryDirtyMBps: 20, NetworkTransmitMbps: 1, NetworkReceiveMbps: 20}, false,
			[]string{"spec.expectedLoad.memoryDirtyMBps, spec.expectedLoad.networkTransmitMbps size nothing without COLO"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := ExpectedLoadWarnings(&ftv1.FaultTolerantVM{Spec: ftv1.FaultTolerantVMSpec{ExpectedLoad: c.load}}, c.colo)
			if len(c.want) == 0 {
				if len(got) > 0 {
					t.Fatalf("warnings %q, want none", got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("warnings %q, want one", got)
			}
			for _, w := range c.want {
				if !strings.Contains(got[0], w) {
					t.Errorf("warning %q does not say %q", got[0], w)
				}
			}
		})
	}
}
