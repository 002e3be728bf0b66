package lockstepd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/go-logr/logr"

	"github.com/lockstep-dev/lockstep/internal/agent"
	"github.com/lockstep-dev/lockstep/internal/channel"
	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/ftlog"
	"github.com/lockstep-dev/lockstep/internal/relay"
	"github.com/lockstep-dev/lockstep/internal/term"
)

// MemberSpec is one member as lockstepd runs it: what the daemon reads from its VMI (MemberOf).
type MemberSpec struct {
	// Pair is the FaultTolerantVM, "namespace/name": it names the pair's FT log and streams.
	Pair string
	// VMI and UID are the member VMI's name and UID; Identity names it in the pair's record.
	VMI, UID, Identity string
	// Primary: the member runs the VM; otherwise it is a secondary.
	Primary bool
}

// EngineEnv is what an engine of a member gets from its node.
type EngineEnv struct {
	Member MemberSpec
	// Dir is the member's directory, which its launcher shares with the node: <run-dir>/<uid>.
	Dir string
	// Owner is the user the member's QEMU runs as (nil: lockstepd's): it owns Dir, and the
	// sockets the engine makes there for QEMU.
	Owner *relay.Owner
	// Relay is the node's stream server; TLS and Dial reach the peer node's.
	Relay *relay.Server
	TLS   *tls.Config
	Dial  func(ctx context.Context, addr string) (net.Conn, error)
	Log   logr.Logger
}

// EngineFactory makes the engine of a member (by --engine name in Main).
type EngineFactory func(EngineEnv) (engine.Engine, error)

// Node is what lockstepd runs on one node for all of its members, apart from the API: the FT
// log's listener and the stream relay, the node's TLS identity, and one agent per member. The
// daemon (daemon.go) drives it from the API; the VM tier drives the same Node without one.
type Node struct {
	Config    Config
	TLS       *tls.Config
	NewEngine EngineFactory
	// Dial opens lockstepd's connections to its peers (nil: TCP, on the logging interface only
	// when Config.LoggingInterface is set).
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// OpenKernelGate opens the kernel backend of the gate (nil: openKernelGate, netfilter).
	OpenKernelGate func(ctx context.Context, iface string, queue uint16, position func() uint64) (agent.KernelGate, error)

	mux    *channel.Mux
	relay  *relay.Server
	peers  peers
	queues atomic.Uint32
	once   sync.Once
}

func (n *Node) init() {
	n.once.Do(func() {
		n.mux = &channel.Mux{TLS: n.TLS, Timeout: n.Config.Timeout, Authorize: n.peers.authorize}
		n.relay = &relay.Server{TLS: n.TLS, Authorize: n.peers.authorize}
		if n.Dial == nil {
			d := net.Dialer{Control: bindToDevice(n.Config.LoggingInterface)}
			n.Dial = func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
		}
		if n.OpenKernelGate == nil {
			hook := n.Config.GateHook
			n.OpenKernelGate = func(ctx context.Context, iface string, queue uint16, position func() uint64) (agent.KernelGate, error) {
				return openKernelGate(ctx, iface, hook, queue, position)
			}
		}
	})
}

// Listen opens the FT log's and the streams' listeners, on the logging interface only when
// --logging-interface is set.
func (n *Node) Listen(ctx context.Context) (logs, streams net.Listener, err error) {
	lc := net.ListenConfig{Control: bindToDevice(n.Config.LoggingInterface)}
	if logs, err = lc.Listen(ctx, "tcp", n.Config.ListenAddress); err != nil {
		return nil, nil, fmt.Errorf("listening for FT logs on %s: %w", n.Config.ListenAddress, err)
	}
	if streams, err = lc.Listen(ctx, "tcp", n.Config.StreamListenAddress); err != nil {
		_ = logs.Close()
		return nil, nil, fmt.Errorf("listening for streams on %s: %w", n.Config.StreamListenAddress, err)
	}
	return logs, streams, nil
}

// Serve serves the FT log on logs and the streams on streams until ctx ends.
func (n *Node) Serve(ctx context.Context, logs, streams net.Listener) error {
	n.init()
	errs := make(chan error, 2)
	go func() { errs <- n.mux.Serve(ctx, logs) }()
	go func() { errs <- n.relay.Serve(ctx, streams) }()
	err := errors.Join(<-errs, <-errs)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// Refused is the number of connections to this node's FT log and streams refused because their
// peer is not the node of the pair's other member. Call it once TLS is set.
func (n *Node) Refused() uint64 {
	n.init()
	return n.mux.Refused() + n.relay.Refused()
}

// Dir is a member's directory on this node (Config.MemberDir).
func (n *Node) Dir(m MemberSpec) string { return n.Config.MemberDir(m) }

// PrepareMemberDir makes a member's directory, which the member's launcher pod mounts (a hostPath
// that must exist: the pod waits for lockstepd to make it), and gives it to the user its QEMU
// runs as, who makes its sockets there (lockstepd's QMP monitor, the secondary's incoming
// migration). Only that user and lockstepd reach it (0700). Where the node runs SELinux it gets
// selinuxLabel ("": as it is), which the launcher's QEMU may use. It is idempotent: a directory
// that is there already (lockstepd restarted, or a launcher made it) is given to the user again.
func PrepareMemberDir(dir string, owner *relay.Owner, selinuxLabel string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("the member's directory: %w", err)
	}
	if err := labelMemberDir(dir, selinuxLabel); err != nil {
		return err
	}
	if owner == nil {
		return nil
	}
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) == owner.UID && int(sys.Gid) == owner.GID && st.Mode().Perm() == 0o700 {
		return nil
	}
	// The mode first, while lockstepd owns it (without CAP_FOWNER it could not change it after).
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chown(dir, owner.UID, owner.GID); err != nil {
		return fmt.Errorf("giving the member's directory to QEMU's user %d:%d: %w", owner.UID, owner.GID, err)
	}
	return nil
}

// Member is a member that runs on this node: its engine and its agent.
type Member struct {
	Spec   MemberSpec
	Agent  *agent.Agent
	Engine engine.Engine
	peers  *peers
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// Stop stops the member's agent (it left the node, or lockstepd stops) and waits for it; the VM
// runs on.
func (m *Member) Stop() {
	m.cancel()
	<-m.done
}

// Done is closed when the agent ended; Err then says why (engine.ErrFenced: it was fenced).
func (m *Member) Done() <-chan struct{} { return m.done }

// Err is why the agent ended.
func (m *Member) Err() error {
	<-m.done
	return m.err
}

// StartMember makes the member's engine and runs its agent until ctx ends or Stop. arb is the
// pair's record as this member sees it; onChange is called (without blocking) whenever the
// agent's state changes.
func (n *Node) StartMember(ctx context.Context, spec MemberSpec, arb engine.Arbiter, log logr.Logger, onChange func()) (*Member, error) {
	n.init()
	owner := n.Config.LauncherOwner()
	if err := PrepareMemberDir(n.Dir(spec), owner, n.Config.MemberDirLabel); err != nil {
		return nil, err
	}
	vm, err := n.NewEngine(EngineEnv{Member: spec, Dir: n.Dir(spec), Owner: owner, Relay: n.relay, TLS: n.TLS, Dial: n.Dial, Log: log})
	if err != nil {
		return nil, fmt.Errorf("making the VM engine of %s: %w", spec.VMI, err)
	}
	queue := uint16(n.queues.Add(1))
	cfg := agent.Config{
		Pair: spec.Pair, Identity: spec.Identity, Primary: spec.Primary,
		Channel: n.Config.ChannelConfig(spec.Pair, n.TLS), Dial: n.Dial,
		Detect: n.Config.Detect, ClaimTimeout: n.Config.ClaimTimeout, Term: term.Term(n.Config.RecordTerm), Log: log, OnChange: onChange,
		OpenKernelGate: func(ctx context.Context, iface string, position func() uint64) (agent.KernelGate, error) {
			return n.OpenKernelGate(ctx, iface, queue, position)
		},
	}
	if n.Config.PaceThreshold > 0 {
		cfg.Pacer = &ftlog.Pacer{Threshold: n.Config.PaceThreshold}
	}
	actx, cancel := context.WithCancel(ctx)
	m := &Member{Spec: spec, Engine: vm, Agent: agent.New(cfg, vm, arb, n.mux), peers: &n.peers, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		defer n.peers.set(spec.Pair, spec.VMI, "")
		m.err = m.Agent.Run(actx)
	}()
	log.Info("started", "primary", spec.Primary)
	return m, nil
}
