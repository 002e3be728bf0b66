//go:build linux

package channel

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/ftlog"
	"github.com/lockstep-dev/lockstep/internal/gate"
	"github.com/lockstep-dev/lockstep/internal/testnet"
	"github.com/lockstep-dev/lockstep/test/faultproxy"
	"github.com/lockstep-dev/lockstep/test/pki"
)

// The benchmarks measure the FT log beside raw TCP and raw TLS on the same path, in the same run,
// so that hack/benchreport can give ratios (make bench). Paths: loopback, and a veth pair between
// two network namespaces the benchmark creates.

// path is where the two sides talk: listen on the B side, dial from the A side.
type path struct {
	name   string
	listen func(tb testing.TB) net.Listener
	dial   func(ctx context.Context, addr string) (net.Conn, error)
}

func paths(tb testing.TB) []path {
	lo := loopback()
	link := testnet.NewLink(tb)
	veth := path{name: "veth",
		listen: func(tb testing.TB) net.Listener {
			var ln net.Listener
			testnet.In(tb, link.B, func() {
				var err error
				if ln, err = net.Listen("tcp", link.BAddr+":0"); err != nil {
					tb.Fatal(err)
				}
			})
			return ln
		},
		dial: func(ctx context.Context, addr string) (net.Conn, error) {
			return testnet.DialContext(ctx, link.A, "tcp", addr)
		},
	}
	return []path{lo, veth}
}

func loopback() path {
	return path{name: "loopback",
		listen: func(tb testing.TB) net.Listener {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				tb.Fatal(err)
			}
			return ln
		},
		dial: func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		},
	}
}

// proxied is loopback through an in-process Toxiproxy that delays each direction by delay: the
// fault proxy of the data-plane tests, here to add 100 µs or 1 ms to a path.
func proxied(name string, delay time.Duration) path {
	lo := loopback()
	return path{name: name,
		listen: func(tb testing.TB) net.Listener {
			ln := lo.listen(tb)
			return proxiedListener{ln, faultproxy.Start(tb, ln.Addr().String(), delay)}
		},
		dial: lo.dial,
	}
}

// proxiedListener accepts on the real listener but gives the proxy's address to dial.
type proxiedListener struct {
	net.Listener
	addr string
}

func (l proxiedListener) Addr() net.Addr {
	a, _ := net.ResolveTCPAddr("tcp", l.addr)
	return a
}

const benchEntry = 16 << 10 // bytes per log entry / write

func BenchmarkLogThroughput(b *testing.B) {
	ca := pki.New(b, "bench-ca")
	for _, p := range paths(b) {
		b.Run(p.name+"/tcp", func(b *testing.B) { rawThroughput(b, p, nil) })
		b.Run(p.name+"/tls", func(b *testing.B) { rawThroughput(b, p, ca) })
		b.Run(p.name+"/ftlog", func(b *testing.B) { logThroughput(b, p, ca) })
	}
}

// rawThroughput writes b.N chunks over TCP (or TLS 1.3 with pki) and waits until all are read.
func rawThroughput(b *testing.B, p path, ca *pki.CA) {
	ln := p.listen(b)
	defer func() { _ = ln.Close() }()
	done := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- -1
			return
		}
		if ca != nil {
			c = tls.Server(c, ServerTLS(ca.TLSConfig(b, "lockstepd")))
		}
		n, _ := io.Copy(io.Discard, c)
		done <- n
	}()
	c, err := p.dial(context.Background(), ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	if ca != nil {
		c = tls.Client(c, ClientTLS(ca.TLSConfig(b, "lockstepd")))
	}
	buf := make([]byte, benchEntry)
	b.SetBytes(benchEntry)
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	_ = c.Close()
	if n := <-done; n != int64(b.N)*benchEntry {
		b.Fatalf("read %d bytes, want %d", n, int64(b.N)*benchEntry)
	}
	b.ReportMetric(float64(b.N)*benchEntry*8/b.Elapsed().Seconds()/1e6, "Mbit/s")
}

// logThroughput logs b.N entries through the channel and waits until all are acknowledged.
func logThroughput(b *testing.B, p path, ca *pki.CA) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, wait := benchPair(b, ctx, p, ca, ftlog.Window{Entries: 4096, Bytes: 64 << 20})
	defer wait()
	buf := make([]byte, benchEntry)
	b.SetBytes(benchEntry)
	b.ResetTimer()
	var last uint64
	for range b.N {
		seq, err := pr.Append(ctx, buf)
		if err != nil {
			b.Fatal(err)
		}
		last = seq
	}
	if err := pr.WaitAcked(ctx, last); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)*benchEntry*8/b.Elapsed().Seconds()/1e6, "Mbit/s")
}

func benchPair(b *testing.B, ctx context.Context, p path, ca *pki.CA, w ftlog.Window) (*Primary, func()) {
	cfg := Config{Pair: "bench/vm", Window: w, Timeout: 2 * time.Second}
	scfg, pcfg := cfg, cfg
	scfg.TLS, pcfg.TLS = ca.TLSConfig(b, "lockstepd"), ca.TLSConfig(b, "lockstepd")
	sec := NewSecondary(scfg, func(ftlog.Entry) error { return nil })
	ln := p.listen(b)
	pr := NewPrimary(pcfg, ln.Addr().String(), 1)
	pr.Dial = p.dial
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = sec.Serve(sctx, ln) }()
	go func() { defer wg.Done(); _ = pr.Run(sctx) }()
	return pr, func() { stop(); wg.Wait() }
}

// BenchmarkGatedOutputLatency measures how long an output waits in the gate: log an entry, hold
// an output behind it, and time until its acknowledgement releases it, one at a time. Beside it,
// the round trip of a raw TCP ping-pong on the same path.
func BenchmarkGatedOutputLatency(b *testing.B) {
	ca := pki.New(b, "bench-ca")
	all := append(paths(b), proxied("proxy-0us", 0), proxied("proxy-100us", 100*time.Microsecond), proxied("proxy-1ms", time.Millisecond))
	for _, p := range all {
		b.Run(p.name+"/rtt", func(b *testing.B) { rttLatency(b, p) })
		b.Run(p.name+"/gated", func(b *testing.B) { gatedLatency(b, p, ca) })
	}
}

func reportPercentiles(b *testing.B, samples []time.Duration) {
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	at := func(q float64) float64 { return float64(samples[int(q*float64(len(samples)-1))].Microseconds()) }
	b.ReportMetric(at(0.5), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
}

func rttLatency(b *testing.B, p path) {
	ln := p.listen(b)
	defer func() { _ = ln.Close() }()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = io.Copy(c, c) // echo
	}()
	c, err := p.dial(context.Background(), ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	msg, reply := make([]byte, 256), make([]byte, 256)
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, reply); err != nil {
			b.Fatal(err)
		}
		samples = append(samples, time.Since(start))
	}
	reportPercentiles(b, samples)
}

func gatedLatency(b *testing.B, p path, ca *pki.CA) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, wait := benchPair(b, ctx, p, ca, ftlog.Window{})
	defer wait()
	var mu sync.Mutex
	var g gate.Gate[chan struct{}]
	pr.OnAck = func(seq uint64) {
		mu.Lock()
		out := g.Ack(seq)
		mu.Unlock()
		for _, ch := range out {
			close(ch)
		}
	}
	// Warm up: the connection is up once the first entry is acknowledged.
	seq, err := pr.Append(ctx, []byte("warm-up"))
	if err != nil {
		b.Fatal(err)
	}
	if err := pr.WaitAcked(ctx, seq); err != nil {
		b.Fatal(err)
	}
	entry := make([]byte, 256)
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		seq, err := pr.Append(ctx, entry)
		if err != nil {
			b.Fatal(err)
		}
		released := make(chan struct{})
		mu.Lock()
		out, err := g.Hold(seq, released)
		mu.Unlock()
		if err != nil {
			b.Fatal(err)
		}
		for _, ch := range out {
			close(ch)
		}
		<-released
		samples = append(samples, time.Since(start))
	}
	reportPercentiles(b, samples)
}
