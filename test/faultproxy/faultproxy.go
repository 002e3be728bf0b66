// Package faultproxy is the fault proxy of the data-plane tests: Toxiproxy (github.com/Shopify/
// toxiproxy), which injects delay, stalls, cut connections and bandwidth limits into a TCP path
// (the kernel here has no netem), plus one toxic it lacks: latency in microseconds (Toxiproxy's
// own counts milliseconds, too coarse for a 100 µs path). Register adds it, under the type name
// "latency_us", through Toxiproxy's documented toxic registry.
package faultproxy

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// MicroLatency delays data by Latency microseconds, keeping its order (Toxiproxy's LatencyToxic,
// in microseconds).
type MicroLatency struct {
	Latency int64 `json:"latency"`
}

// spinBelow is the delay under which MicroLatency spins rather than sleeps.
const spinBelow = 2 * time.Millisecond

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
			if sleep := delay - time.Since(c.Timestamp); sleep > 0 && sleep < spinBelow {
				// Go's timers fire up to a millisecond late when the runtime is idle (the
				// netpoller waits in milliseconds): a short delay is spun instead.
				for time.Since(c.Timestamp) < delay {
					runtime.Gosched()
				}
			} else if sleep > 0 {
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

var register sync.Once

// Register adds the toxics of this package to Toxiproxy's registry (once).
func Register() {
	register.Do(func() { toxics.Register("latency_us", new(MicroLatency)) })
}

// Start runs an in-process Toxiproxy proxy from a new loopback port to upstream, with every
// byte delayed by delay in each direction (none for 0), and returns its address; it stops when
// the test ends.
func Start(tb testing.TB, upstream string, delay time.Duration) string {
	tb.Helper()
	Register()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(server, "bench", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Stop)
	if delay > 0 {
		for _, stream := range []string{"upstream", "downstream"} {
			js := fmt.Sprintf(`{"name":"delay-%s","type":"latency_us","stream":%q,"attributes":{"latency":%d}}`, stream, stream, delay.Microseconds())
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
				tb.Fatal(err)
			}
		}
	}
	return p.Listen
}
