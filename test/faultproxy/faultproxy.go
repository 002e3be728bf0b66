// Package faultproxy is the fault proxy of the data-plane tests: Toxiproxy (github.com/Shopify/
// toxiproxy), which injects delay, stalls, cut connections and bandwidth limits into a TCP path
// (the kernel here has no netem), plus one toxic it lacks: latency in microseconds (Toxiproxy's
// own counts milliseconds, too coarse for a 100 µs path). Register adds it, under the type name
// "latency_us", through Toxiproxy's documented toxic registry.
package faultproxy

import (
	"time"

	"github.com/Shopify/toxiproxy/v2/toxics"
)

// MicroLatency delays data by Latency microseconds, keeping its order (Toxiproxy's LatencyToxic,
// in microseconds).
type MicroLatency struct {
	Latency int64 `json:"latency"`
}

// GetBufferSize implements toxics.BufferedToxic.
func (t *MicroLatency) GetBufferSize() int { return 1024 }

// Pipe implements toxics.Toxic.
func (t *MicroLatency) Pipe(stub *toxics.ToxicStub) {
	delay := time.Duration(t.Latency) * time.Microsecond
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if sleep := delay - time.Since(c.Timestamp); sleep > 0 {
				timer := time.NewTimer(sleep)
				select {
				case <-timer.C:
				case <-stub.Interrupt:
					timer.Stop()
					stub.Output <- c
					return
				}
			}
			stub.Output <- c
		}
	}
}

var registered bool

// Register adds the toxics of this package to Toxiproxy's registry (once).
func Register() {
	if !registered {
		toxics.Register("latency_us", new(MicroLatency))
		registered = true
	}
}
