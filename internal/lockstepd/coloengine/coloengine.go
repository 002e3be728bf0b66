// Package coloengine wires the QEMU COLO engine (internal/colo) into lockstepd: a member → the
// engine's configuration, with the node's relay, TLS and the member's directory. cmd/lockstepd
// registers it as the default engine; the VM tier runs the same factory. It is a package of its
// own so that the daemon does not depend on any one engine.
package coloengine

import (
	"context"
	"flag"
	"time"

	"github.com/lockstep-dev/lockstep/internal/colo"
	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/lockstepd"
)

// Options are the COLO engine's settings, the same for every member of the node.
type Options struct {
	// Checkpoint is the longest time between two checkpoints.
	Checkpoint time.Duration
	// CompareTimeout is how long colo-compare holds an unmatched packet of the primary.
	CompareTimeout time.Duration
	// CrossedWait forces a checkpoint where both guests' data waited crossed this long (colo.Tuning).
	CrossedWait time.Duration
	// RAMAhead sends a checkpoint's dirty pages while the VM still runs (colo.Tuning).
	RAMAhead bool
	// AttachNetwork, when set, attaches a member's VM network to its node when it goes live (a
	// test's switch; on an L2 network, QEMU's announce-self moves the VM's MAC).
	AttachNetwork func(ctx context.Context, m lockstepd.MemberSpec) error
	// OnCheckpoint, when set, sees every checkpoint of a member that is a primary.
	OnCheckpoint func(m lockstepd.MemberSpec, cp colo.Checkpoint)
}

// BindFlags defines the engine's flags.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.DurationVar(&o.Checkpoint, "colo-checkpoint", 2*time.Second, "COLO: the longest time between two checkpoints (colo-compare forces one sooner when the two sides' packets differ).")
	fs.DurationVar(&o.CompareTimeout, "colo-compare-timeout", 100*time.Millisecond, "COLO: how long colo-compare holds a packet of the primary that the secondary has not matched before it forces a checkpoint.")
	fs.DurationVar(&o.CrossedWait, "colo-crossed-wait", 20*time.Millisecond, "COLO: force a checkpoint before the compare timeout where data of the primary's has waited this long on one TCP connection and data of the secondary's on another: guests that each wait for what the other gave away, as a database's row locks granted in a different order (lockstep's QEMU, x-crossed-timeout: a QEMU without it is protected without the wait; 0: off).")
	fs.BoolVar(&o.RAMAhead, "colo-ram-ahead", true, "COLO: send the pages the VM dirtied while it still runs, just before each checkpoint, so that the checkpoint's pause sends only those dirtied meanwhile (lockstep's QEMU; false for a QEMU without x-colo-ram-ahead).")
}

// Factory makes the COLO engine of each member.
func Factory(o Options) lockstepd.EngineFactory {
	return func(env lockstepd.EngineEnv) (engine.Engine, error) {
		cfg := colo.EngineConfig{
			Pair: env.Member.Pair, Member: env.Member.VMI, Primary: env.Member.Primary, Sockets: colo.Sockets{Dir: env.Dir}, Owner: env.Owner,
			Tuning: colo.Tuning{Checkpoint: o.Checkpoint, CompareTimeout: o.CompareTimeout, CrossedWait: o.CrossedWait, RAMAhead: o.RAMAhead},
			Relay:  env.Relay, TLS: env.TLS, Dial: env.Dial, Log: env.Log,
		}
		if err := cfg.Sockets.Validate(); err != nil {
			return nil, err
		}
		if o.AttachNetwork != nil {
			m := env.Member
			cfg.AttachNetwork = func(ctx context.Context) error { return o.AttachNetwork(ctx, m) }
		}
		if o.OnCheckpoint != nil {
			m := env.Member
			cfg.OnCheckpoint = func(cp colo.Checkpoint) { o.OnCheckpoint(m, cp) }
		}
		return colo.NewEngine(cfg), nil
	}
}
