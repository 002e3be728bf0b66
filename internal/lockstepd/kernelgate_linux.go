//go:build linux

package lockstepd

import (
	"context"

	"github.com/lockstep-dev/lockstep/internal/agent"
	"github.com/lockstep-dev/lockstep/internal/netgate"
)

func openKernelGate(ctx context.Context, iface string, hook string, queue uint16, position func() uint64) (agent.KernelGate, error) {
	return netgate.Open(ctx, netgate.Config{Interface: iface, Hook: netgate.Hook(hook), Queue: queue}, position)
}
