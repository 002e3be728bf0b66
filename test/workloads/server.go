package workloads

import (
	"context"
	"fmt"
)

// startServer runs command in the guest as the transient systemd unit lockstep-<unit> and
// waits until it listens on port: the workload's server, started for a run and stopped after.
func startServer(ctx context.Context, env Env, unit string, port int, command string) (stop func(), err error) {
	name := "lockstep-" + unit
	out, err := env.Guest(ctx, fmt.Sprintf(
		"sudo systemctl stop %[1]s 2>/dev/null; sudo systemctl reset-failed %[1]s 2>/dev/null; "+
			"sudo systemd-run --quiet --collect --unit=%[1]s %[2]s && "+
			"for i in $(seq 100); do ss -Hltn sport = :%[3]d | grep -q . && exit 0; sleep 0.1; done; "+
			"echo 'not listening on %[3]d'; exit 1", name, command, port))
	if err != nil {
		return nil, fmt.Errorf("starting %s in the guest: %w: %s", unit, err, lastLine(out))
	}
	return func() { _, _ = env.Guest(context.WithoutCancel(ctx), "sudo systemctl stop "+name+" 2>/dev/null; true") }, nil
}
