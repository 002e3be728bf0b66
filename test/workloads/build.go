package workloads

import (
	"context"
	"fmt"
	"time"
)

// LuaSource is where the guest image keeps the source it builds (hack/debian-guest/sources).
const LuaSource = "/usr/local/src/lua-5.4.4.tar.gz"

// build is the CPU- and memory-bound row: Lua 5.4 (34 C files) built from its source with the
// guest's gcc, make -j as many as the guest's vCPUs, timed from the client (the guest's clock is
// not the one to trust under COLO) around the ssh command that runs make alone: its source is
// unpacked before and removed after, untimed.
var build = Workload{
	Name:  "build",
	Title: "C build (Lua 5.4, gcc, make -j vCPUs)",
	Paper: "Kernel compile (CPU and MMU bound, forks): FT's overhead very small; SPECjbb2005 (CPU and memory bound): FT depends on the secondary keeping pace",
	Run: func(ctx context.Context, env Env) ([]Measure, error) {
		target := "linux"
		if env.Brief {
			target = "-C src lapi.o"
		}
		dir := fmt.Sprintf("/tmp/lockstep-build-%d", time.Now().UnixNano())
		if out, err := env.Guest(ctx, fmt.Sprintf("set -e; mkdir %[1]s; cd %[1]s; tar xzf %[2]s; sync", dir, LuaSource)); err != nil {
			return nil, fmt.Errorf("unpacking %s: %w: %s", LuaSource, err, lastLine(out))
		}
		defer func() { _, _ = env.Guest(context.WithoutCancel(ctx), "rm -rf "+dir) }()
		// A failed parallel build says why from a serial one, and fails.
		cmd := fmt.Sprintf("cd %s/lua-5.4.4 && { make -s -j$(nproc) %[2]s >/dev/null 2>&1 || { make %[2]s; exit 1; }; }", dir, target)
		start := time.Now()
		if out, err := env.Guest(ctx, cmd); err != nil {
			return nil, fmt.Errorf("the build: %w: %s", err, lastLine(out))
		}
		return []Measure{{Name: "time to build", Unit: "s", Value: time.Since(start).Seconds(), Goal: 1 / 0.9}}, nil
	},
}
