package colo

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/go-logr/logr"
)

// The member that goes live holds the pair's record and the only copy of the VM's state: a step
// that fails once is tried again, and a failed announcement does not stop the VM (finding 7 of
// issue 58: either fenced the member, and the VM restarted from its disks).
func TestAGoLiveStepThatFailsOnceIsTriedAgain(t *testing.T) {
	f := &fakeQEMU{failFirst: map[string]int{"x-colo-lost-heartbeat": 1}}
	attaches := 0
	e := NewEngine(EngineConfig{Log: logr.Discard(), AttachNetwork: func(context.Context) error {
		attaches++
		if attaches == 1 {
			return errors.New("the bridge is not there yet")
		}
		return nil
	}})
	if err := e.goLive(context.Background(), f.conn(t), false); err != nil {
		t.Fatalf("go-live with one failed step and one failed attach: %v", err)
	}
	if n := count(f.commands(), "x-colo-lost-heartbeat"); n != 2 || attaches != 2 {
		t.Fatalf("x-colo-lost-heartbeat sent %d times, the network attached %d times; want 2 each", n, attaches)
	}
	if !slices.Contains(f.commands(), "announce-self") {
		t.Fatal("no announcement")
	}
}

func TestAGoLiveWhoseAnnouncementFailsRunsTheVM(t *testing.T) {
	f := &fakeQEMU{refuse: map[string]string{"announce-self": "no NIC to announce"}}
	e := NewEngine(EngineConfig{Log: logr.Discard()})
	if err := e.goLive(context.Background(), f.conn(t), false); err != nil {
		t.Fatalf("a failed announcement stopped the go-live: %v", err)
	}
	e.mu.Lock()
	live := e.live
	e.mu.Unlock()
	if !live {
		t.Fatal("not live")
	}
}

func TestAGoLiveStepThatKeepsFailingStopsIt(t *testing.T) {
	f := &fakeQEMU{failFirst: map[string]int{"x-colo-lost-heartbeat": goLiveAttempts}}
	e := NewEngine(EngineConfig{Log: logr.Discard()})
	if err := e.goLive(context.Background(), f.conn(t), false); err == nil {
		t.Fatal("a go-live whose step failed at every attempt succeeded")
	}
}

func count(cmds []string, cmd string) int {
	n := 0
	for _, c := range cmds {
		if c == cmd {
			n++
		}
	}
	return n
}
