// Package channel carries the FT log (internal/ftlog) between a primary and its secondary: one
// mutually authenticated TLS 1.3 connection per pair over the logging network, batched entries,
// cumulative acknowledgements, heartbeats both ways, reconnection that resumes from the last
// acknowledged entry, and the silence detector the secondary's go-live decision starts from. It
// knows nothing of Kubernetes; lockstepd wires it to the VM engine, the output gate and the Lease.
//
// The secondary listens; the primary dials. Each connection starts with a Hello each way: the
// primary's names the pair and its epoch, the secondary's says which entry it needs next.
package channel

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/lockstep-dev/lockstep/internal/ftlog"
)

// Config is what both sides share.
type Config struct {
	// Pair names the FaultTolerantVM ("namespace/name"); both sides must agree.
	Pair string
	// TLS is the side's TLS configuration, with its certificate and the CA it trusts; Server and
	// Client force TLS 1.3 and, on the server, a verified client certificate.
	TLS *tls.Config
	// Heartbeat is how often a side that has nothing else to send proves it is alive.
	Heartbeat time.Duration
	// Timeout is how long a side may stay silent before its peer drops the connection (and the
	// secondary counts the primary as silent).
	Timeout time.Duration
	// Window bounds the unacknowledged entries (flow control).
	Window ftlog.Window
	// MaxBatchEntries and MaxBatchBytes bound one Entries frame.
	MaxBatchEntries, MaxBatchBytes int
	// PeerNode, when set, is the node whose lockstepd the primary must reach: a secondary whose
	// certificate names another node is refused (nodecert.Expect).
	PeerNode string
}

// Defaults for a zero Config field.
const (
	DefaultHeartbeat       = 50 * time.Millisecond
	DefaultTimeout         = 300 * time.Millisecond
	DefaultMaxBatchEntries = 1024
	DefaultMaxBatchBytes   = 1 << 20
)

func (c Config) withDefaults() Config {
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxBatchEntries <= 0 {
		c.MaxBatchEntries = DefaultMaxBatchEntries
	}
	if c.MaxBatchBytes <= 0 {
		c.MaxBatchBytes = DefaultMaxBatchBytes
	}
	return c
}

// ErrHandshake is wrapped by errors of a peer that is not the expected one.
var ErrHandshake = errors.New("channel handshake failed")

// ErrResigned ends a connection on which the primary resigned (ftlog.Resign): it stopped running
// the VM.
var ErrResigned = errors.New("the primary resigned")

// ServerTLS and ClientTLS force what lockstepd requires of TLS between nodes (the FT log and the
// relayed COLO streams): TLS 1.3 and a certificate on both ends.
func ServerTLS(c *tls.Config) *tls.Config {
	c = c.Clone()
	c.MinVersion = tls.VersionTLS13
	// A peer certificate is always required; it is verified by the library against ClientCAs,
	// or by the configuration's own VerifyConnection (lockstepd's, which follows CA renewals).
	if c.ClientAuth < tls.RequireAnyClientCert || c.VerifyConnection == nil {
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return c
}

func ClientTLS(c *tls.Config) *tls.Config {
	c = c.Clone()
	c.MinVersion = tls.VersionTLS13
	return c
}

// logALPN is the TLS application protocol by which the log channel's two ends learn, before the
// first Hello, that both speak ftlog.Version. A secondary of version 1 names none, and a Hello of
// any other version than its own ends its connection: that close would say nothing certain (a
// secondary also closes a connection for a pair it does not serve, or while it restarts), so a
// primary never guesses from it.
const logALPN = "lockstep-ftlog/2"

// logServerTLS and logClientTLS are ServerTLS and ClientTLS for the log channel.
func logServerTLS(c *tls.Config) *tls.Config {
	c = ServerTLS(c)
	c.NextProtos = []string{logALPN}
	return c
}

func logClientTLS(c *tls.Config) *tls.Config {
	c = ClientTLS(c)
	c.NextProtos = []string{logALPN}
	return c
}

// helloVersion is the version a primary's Hello says on c: ftlog.Version when the secondary's
// end named logALPN, else ftlog.MinVersion.
func helloVersion(c *conn) uint8 {
	if tc, ok := c.Conn.(*tls.Conn); ok && tc.ConnectionState().NegotiatedProtocol == logALPN {
		return ftlog.Version
	}
	return ftlog.MinVersion
}

// conn is one established connection with its buffered reader and writer.
type conn struct {
	net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	wbuf []byte // encoding buffer, reused (only the connection's writer goroutine writes)
	// epoch is the primary's, on a secondary's connection (set when it is admitted).
	epoch uint64
}

func newConn(c net.Conn) *conn {
	return &conn{Conn: c, r: bufio.NewReaderSize(c, 256<<10), w: bufio.NewWriterSize(c, 256<<10)}
}

// handshake runs the TLS handshake within timeout and returns the connection, closed when ctx
// ends, and the function that closes it.
func handshake(ctx context.Context, tc *tls.Conn, timeout time.Duration) (*conn, func(), error) {
	c := newConn(tc)
	stopWatch := context.AfterFunc(ctx, func() { _ = c.Close() })
	stop := func() { stopWatch(); _ = c.Close() }
	err := tc.SetDeadline(time.Now().Add(timeout))
	if err == nil {
		err = tc.HandshakeContext(ctx)
	}
	if err == nil {
		err = tc.SetDeadline(time.Time{})
	}
	if err != nil {
		stop()
		return nil, nil, err
	}
	return c, stop, nil
}

func (c *conn) write(frames ...ftlog.Frame) error {
	for _, f := range frames {
		var err error
		if c.wbuf, err = ftlog.AppendFrame(c.wbuf[:0], f); err != nil {
			return err
		}
		if _, err := c.w.Write(c.wbuf); err != nil {
			return err
		}
	}
	return c.w.Flush()
}

// read reads a frame, failing when nothing arrives within timeout.
func (c *conn) read(timeout time.Duration) (ftlog.Frame, error) {
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return ftlog.Frame{}, err
	}
	return ftlog.ReadFrame(c.r)
}

func expectHello(f ftlog.Frame, role ftlog.Role, pair string) (*ftlog.Hello, error) {
	if f.Type != ftlog.FrameHello {
		return nil, fmt.Errorf("%w: first frame is %s, not Hello", ErrHandshake, f.Type)
	}
	if f.Hello.Role != role {
		return nil, fmt.Errorf("%w: peer has role %d, want %d", ErrHandshake, f.Hello.Role, role)
	}
	if f.Hello.Pair != pair {
		return nil, fmt.Errorf("%w: peer serves pair %q, not %q", ErrHandshake, f.Hello.Pair, pair)
	}
	return f.Hello, nil
}
