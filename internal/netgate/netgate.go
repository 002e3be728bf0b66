//go:build linux

// Package netgate is the Linux backend of the output commit gate: it holds the VM's outbound
// packets in the kernel and lets each one go only when the secondary has acknowledged the log
// position before it (internal/gate decides; this package is the adapter).
//
// Remus holds a tap's queue with the `plug` qdisc; kernels without it (this project's CI has
// none) still have nf_tables and nfnetlink_queue. So an nf_tables rule sends every packet leaving
// through the VM's interface to an NFQUEUE queue (through the xtables NFQUEUE target, which
// kernels without nft's native `queue` expression still have), lockstepd reads it, and gives each
// packet its verdict (accept) when the acknowledgement arrives. The rule has no bypass flag: with
// lockstepd gone, packets are dropped, never released unacknowledged.
package netgate

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"

	nfqueue "github.com/florianl/go-nfqueue/v2"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/lockstep-dev/lockstep/internal/gate"
)

// Hook says where the packets are caught.
type Hook string

const (
	// HookForward catches packets a bridged or routed VM sends through its tap (production).
	HookForward Hook = "forward"
	// HookOutput catches packets sent by local processes (tests, and guests in the host's stack).
	HookOutput Hook = "output"
)

// Config says which packets to gate.
type Config struct {
	// NetNS is the path of the network namespace to work in ("" for the current one).
	NetNS string
	// Interface is the interface the gated packets leave through (the VM's tap, or its uplink).
	Interface string
	Hook      Hook
	// Queue is the NFQUEUE queue number; one per gated VM on a node.
	Queue uint16
	// MaxHeld bounds the packets held in the kernel; beyond it the kernel drops (the sender
	// retransmits, as after any loss).
	MaxHeld uint32
}

// TableName is the nf_tables table (family inet) that holds lockstep's gate chains.
const TableName = "lockstep"

// Gate holds one VM's outbound packets until their log position is acknowledged.
type Gate struct {
	cfg      Config
	position func() uint64
	nf       *nfqueue.Nfqueue
	stop     context.CancelFunc // ends the queue reader (go-nfqueue's Close waits for it)
	nsFile   *os.File           // the namespace, open while the gate lives
	nsFd     int

	mu      sync.Mutex
	g       gate.Gate[uint32]
	fenced  bool
	stats   Stats
	verdict func(id uint32, v int) error
}

// Stats counts packets.
type Stats struct {
	Queued, Released, Dropped uint64
	VerdictErrors             uint64
}

// Open installs the rule and starts gating. position returns the log position a packet leaving
// now follows (the primary's last logged entry).
func Open(ctx context.Context, cfg Config, position func() uint64) (*Gate, error) {
	if cfg.Interface == "" || len(cfg.Interface) >= unix.IFNAMSIZ {
		return nil, fmt.Errorf("interface name %q is empty or too long", cfg.Interface)
	}
	if cfg.MaxHeld == 0 {
		cfg.MaxHeld = 4096
	}
	g := &Gate{cfg: cfg, position: position, nsFd: -1}
	if cfg.NetNS != "" {
		f, err := os.Open(cfg.NetNS)
		if err != nil {
			return nil, fmt.Errorf("opening network namespace %s: %w", cfg.NetNS, err)
		}
		g.nsFile, g.nsFd = f, int(f.Fd())
	}
	nf, err := nfqueue.Open(&nfqueue.Config{
		NetNS: max(g.nsFd, 0), NfQueue: cfg.Queue, MaxQueueLen: cfg.MaxHeld,
		MaxPacketLen: 0, Copymode: nfqueue.NfQnlCopyMeta, AfFamily: unix.AF_UNSPEC,
	})
	if err != nil {
		_ = g.Close()
		return nil, fmt.Errorf("opening NFQUEUE %d: %w", cfg.Queue, err)
	}
	_ = nf.SetOption(netlink.NoENOBUFS, true)
	g.verdict = nf.SetVerdict
	g.nf = nf
	ctx, g.stop = context.WithCancel(ctx)
	if err := nf.RegisterWithErrorFunc(ctx, g.onPacket, func(error) int { return 0 }); err != nil {
		_ = g.Close()
		return nil, fmt.Errorf("reading NFQUEUE %d: %w", cfg.Queue, err)
	}
	if err := g.installRule(); err != nil {
		_ = g.Close()
		return nil, err
	}
	return g, nil
}

// onPacket holds a packet behind the current log position.
func (g *Gate) onPacket(a nfqueue.Attribute) int {
	if a.PacketID == nil {
		return 0
	}
	id := *a.PacketID
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stats.Queued++
	if g.fenced {
		g.give(id, nfqueue.NfDrop)
		return 0
	}
	out, err := g.g.Hold(g.position(), id)
	if err != nil { // positions never go back; if they did, the packet cannot be placed safely
		g.give(id, nfqueue.NfDrop)
		return 0
	}
	g.release(out)
	return 0
}

// Ack releases the packets whose log position the secondary acknowledged, in order.
func (g *Gate) Ack(seq uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fenced {
		return
	}
	g.release(g.g.Ack(seq))
}

// Fence drops every held packet and every later one: this side lost the right to speak.
func (g *Gate) Fence() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.fenced = true
	for _, id := range g.g.Drop() {
		g.give(id, nfqueue.NfDrop)
	}
}

// Held is the number of packets waiting.
func (g *Gate) Held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.g.Held()
}

// Stats returns the counters.
func (g *Gate) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stats
}

// release accepts packets; the caller holds mu.
func (g *Gate) release(ids []uint32) {
	for _, id := range ids {
		g.give(id, nfqueue.NfAccept)
	}
}

func (g *Gate) give(id uint32, v int) {
	if err := g.verdict(id, v); err != nil {
		g.stats.VerdictErrors++
		return
	}
	if v == nfqueue.NfAccept {
		g.stats.Released++
	} else {
		g.stats.Dropped++
	}
}

// Close removes the rule and stops reading the queue. Packets still held are dropped by the
// kernel with the queue.
func (g *Gate) Close() error {
	var err error
	if g.nf != nil {
		err = g.removeRule()
		if g.stop != nil {
			g.stop()
		}
		err = errors.Join(err, g.nf.Close())
	}
	if g.nsFile != nil {
		err = errors.Join(err, g.nsFile.Close())
	}
	return err
}

func (g *Gate) conn() (*nftables.Conn, error) {
	if g.nsFd >= 0 {
		return nftables.New(nftables.WithNetNSFd(g.nsFd))
	}
	return nftables.New()
}

func (g *Gate) chainName() string { return fmt.Sprintf("gate-%d", g.cfg.Queue) }

// installRule adds, in table inet lockstep, a chain for this queue with one rule:
// oifname <interface> queue num <queue>.
func (g *Gate) installRule() error {
	c, err := g.conn()
	if err != nil {
		return err
	}
	hook := nftables.ChainHookOutput
	if g.cfg.Hook == HookForward {
		hook = nftables.ChainHookForward
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: TableName})
	ch := c.AddChain(&nftables.Chain{Name: g.chainName(), Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: hook, Priority: nftables.ChainPriorityFilter})
	name := make([]byte, unix.IFNAMSIZ)
	copy(name, g.cfg.Interface)
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: name},
		nfqueueTarget(g.cfg.Queue),
	}})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing the nf_tables gate rule for %s: %w", g.cfg.Interface, err)
	}
	return nil
}

// nfqueueTarget is xtables' NFQUEUE target (revision 3) run by nf_tables' compat layer: kernels
// without the native nft `queue` expression (CONFIG_NFT_QUEUE, absent here) have it. Its info is
// struct xt_NFQ_info_v3 {u16 queuenum, queues_total, flags} in host byte order, padded to 8 bytes.
// No flags: in particular no bypass, so without a reader the kernel drops rather than releases.
func nfqueueTarget(queue uint16) *expr.Target {
	info := make(xt.Unknown, 8)
	binary.NativeEndian.PutUint16(info[0:], queue)
	binary.NativeEndian.PutUint16(info[2:], 1) // queues_total
	return &expr.Target{Name: "NFQUEUE", Rev: 3, Info: &info}
}

func (g *Gate) removeRule() error {
	c, err := g.conn()
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	c.DelChain(&nftables.Chain{Name: g.chainName(), Table: t})
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing the nf_tables gate rule: %w", err)
	}
	return nil
}
