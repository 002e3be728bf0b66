package controllers

import "testing"

func TestAttachesReadsMultusAnnotations(t *testing.T) {
	for _, c := range []struct {
		podNS, networks string
		want            bool
	}{
		{"lockstep-system", "tenant/ft-logging@ftlog", true},
		{"lockstep-system", "lockstep-system/ft-logging@ftlog", false},
		{"lockstep-system", "ft-logging@ftlog", false}, // its own namespace: another network
		{"tenant", "ft-logging", true},
		{"lockstep-system", "other/ft-logging, tenant/ft-logging@ftlog", true},
		{"lockstep-system", "tenant/ft-logging2", false},
		{"lockstep-system", `[{"name":"ft-logging","namespace":"tenant","interface":"ftlog"}]`, true},
		{"tenant", `[{"name":"ft-logging"}]`, true},
		{"lockstep-system", `[{"name":"ft-logging"}]`, false},
		{"lockstep-system", "", false},
		{"lockstep-system", "[not json", false},
	} {
		if got := attaches(c.podNS, c.networks, "tenant", "ft-logging"); got != c.want {
			t.Errorf("a pod in %s with %q attaches tenant/ft-logging: %v, want %v", c.podNS, c.networks, got, c.want)
		}
	}
}
