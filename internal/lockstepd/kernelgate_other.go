//go:build !linux

package lockstepd

import (
	"context"
	"errors"

	"github.com/lockstep-dev/lockstep/internal/agent"
)

func openKernelGate(context.Context, string, string, uint16, func() uint64) (agent.KernelGate, error) {
	return nil, errors.New("the kernel gate needs Linux (nf_tables and NFQUEUE)")
}
