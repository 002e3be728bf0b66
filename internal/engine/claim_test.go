package engine_test

import (
	"errors"
	"testing"

	"github.com/lockstep-dev/lockstep/internal/engine"
)

func TestDecideClaim(t *testing.T) {
	for _, tc := range []struct {
		name     string
		holder   engine.Holder
		known    uint64
		epoch    uint64
		write    bool
		lost     bool
		identity string
	}{
		{name: "the record is at the epoch the side knew: it takes the next", holder: engine.Holder{Identity: "n2/b", Epoch: 3}, identity: "n1/a", known: 3, epoch: 4, write: true},
		{name: "the side holds the record and claims from its own epoch: a new one", holder: engine.Holder{Identity: "n1/a", Epoch: 3}, identity: "n1/a", known: 3, epoch: 4, write: true},
		{name: "an earlier claim of this side went through", holder: engine.Holder{Identity: "n1/a", Epoch: 4}, identity: "n1/a", known: 3, epoch: 4},
		{name: "the other side moved first", holder: engine.Holder{Identity: "n2/b", Epoch: 4}, identity: "n1/a", known: 3, lost: true},
		{name: "a stale view of an older epoch", holder: engine.Holder{Identity: "n2/b", Epoch: 2}, identity: "n1/a", known: 3, lost: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			epoch, write, err := engine.DecideClaim(tc.holder, tc.identity, tc.known)
			if tc.lost != errors.Is(err, engine.ErrLost) || !tc.lost && err != nil {
				t.Fatalf("err %v, want lost %v", err, tc.lost)
			}
			if epoch != tc.epoch || write != tc.write {
				t.Fatalf("epoch %d write %v, want %d %v", epoch, write, tc.epoch, tc.write)
			}
		})
	}
}
