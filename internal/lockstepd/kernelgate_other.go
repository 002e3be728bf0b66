//go:build !linux

package lockstepd

import (
	"context"
	"errors"
)

func openKernelGate(context.Context, string, string, uint16, func() uint64) (KernelGate, error) {
	return nil, errors.New("the kernel gate needs Linux (nf_tables and NFQUEUE)")
}
