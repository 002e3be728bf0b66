// Command lockstepd-vmdouble is lockstepd with the counter VM of test/vmdouble as its engine:
// a test double that stands in for QEMU in the data-plane tests.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/lockstepd"
	"github.com/lockstep-dev/lockstep/test/vmdouble"
)

func main() {
	output := flag.String("vmdouble-output", "", "UDP address the counter VM sends its outputs to (empty: none).")
	iface := flag.String("vmdouble-interface", "", "Interface the outputs leave through, held by the kernel gate (empty: the in-process gate).")
	trace := flag.String("vmdouble-trace", "", "File the counter VM appends its trace to.")
	step := flag.Duration("vmdouble-step", time.Millisecond, "Pause between two counter values.")
	var traceFile io.Writer
	var once sync.Once
	os.Exit(lockstepd.Main(map[string]lockstepd.EngineFactory{
		"vmdouble": func(env lockstepd.EngineEnv) (engine.Engine, error) {
			var err error
			once.Do(func() {
				if *trace != "" {
					traceFile, err = os.OpenFile(*trace, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
				}
			})
			if err != nil {
				return nil, err
			}
			c := &vmdouble.Counter{Name: env.Member.VMI, Step: *step, Iface: *iface}
			if traceFile != nil {
				c.Trace = prefixed{traceFile, env.Member.VMI}
			}
			if *output != "" {
				if c.Emit, err = vmdouble.UDPEmitter(*output); err != nil {
					return nil, fmt.Errorf("vmdouble output: %w", err)
				}
			}
			return c, nil
		},
	}))
}

// prefixed writes each trace line (one Write) prefixed with the VMI's name.
type prefixed struct {
	w    io.Writer
	name string
}

func (p prefixed) Write(b []byte) (int, error) {
	_, err := p.w.Write(append([]byte(p.name+" "), b...))
	return len(b), err
}
