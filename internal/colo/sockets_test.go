package colo

import (
	"strings"
	"testing"
)

func TestSocketPathsFitAUnixSocket(t *testing.T) {
	ok := Sockets{Dir: "/var/run/lockstep/0b5a4c3e-1d2f-4a6b-9c8d-7e6f5a4b3c2d"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("the default layout: %v", err)
	}
	long := Sockets{Dir: "/tmp/TestColoSurvivesLockstepdRestartsOnEitherSide1234567890/001/0b5a4c3e-1d2f-4a6b-9c8d-7e6f5a4b3c2d"}
	if err := long.Validate(); err == nil || !strings.Contains(err.Error(), "shorter run directory") {
		t.Fatalf("a directory whose sockets cannot exist: %v", err)
	}
	if err := (Sockets{}).Validate(); err == nil {
		t.Fatal("no directory must be refused")
	}
}
