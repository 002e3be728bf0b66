//go:build linux && vmtier

package vmtier

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/lockstep-dev/lockstep/internal/channel"
	"github.com/lockstep-dev/lockstep/internal/relay"
)

// intruder is the lockstepd of a node that holds no member of the pair, with that node's own
// certificate from the signer: what a compromised or misconfigured node could try.
type intruder struct {
	c   *cluster
	n   *node
	tls *tls.Config
}

func (c *cluster) intruder(n *node) *intruder {
	cert, err := tls.LoadX509KeyPair(filepath.Join(n.tlsDir(c), "tls.crt"), filepath.Join(n.tlsDir(c), "tls.key"))
	if err != nil {
		c.t.Fatalf("the certificate of %s's lockstepd: %v", n.name, err)
	}
	// The intruder does not care who answers; the members must care who asks.
	return &intruder{c: c, n: n, tls: &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}} //nolint:gosec // see above
}

// tlsDir is where node n's lockstepd process keeps its certificate, key and the CA's certificate.
func (n *node) tlsDir(c *cluster) string { return filepath.Join(c.dir, n.name+"-tls") }

// stream tries to open one of the streams that member to receives (its QEMU listens on it: the
// secondary's disk replica, the primary's packet comparison). It reports whether anything
// answered or held the stream open: a refused stream is closed at once.
func (in *intruder) stream(to *member, stream string) bool {
	t := in.c.t
	f := &relay.Forward{Stream: stream, Path: filepath.Join(in.c.dir, "intruder-"+stream+".sock"), TLS: in.tls, Dial: dialFrom(in.n),
		Peer: func() relay.Target {
			return relay.Target{Addr: to.node.streamAddr(), Node: to.node.name, Key: relay.Key(pairName, to.name)}
		}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := f.Listen(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("unix", f.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = c.Read(make([]byte, 1))
	return !errors.Is(err, io.EOF)
}

// log tries to become the pair's primary at node to's FT log, with a higher epoch than any the
// pair has had. It reports whether an entry was acknowledged.
func (in *intruder) log(to *node) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	p := channel.NewPrimary(channel.Config{Pair: pairName, TLS: in.tls, PeerNode: to.name, Heartbeat: heartbeat, Timeout: timeout}, to.logAddr(), 1<<40)
	p.Dial = dialFrom(in.n)
	go func() { _ = p.Run(ctx) }()
	seq, err := p.Append(ctx, []byte("intruder"))
	return err == nil && p.WaitAcked(ctx, seq) == nil
}

// refused reads lockstepd_peers_refused_total from the metrics of node n's lockstepd process.
func (c *cluster) refused(n *node) float64 {
	t := c.t
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
		return dialFrom(n)(ctx, addr)
	}}}
	resp, err := hc.Get("http://127.0.0.1:9410/metrics")
	if err != nil {
		t.Fatalf("metrics of %s's lockstepd: %v", n.name, err)
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "lockstepd_peers_refused_total "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("%s's lockstepd exports no lockstepd_peers_refused_total", n.name)
	return 0
}
