//go:build linux && vmtier

package vmtier

import (
	"encoding/binary"
	"net"
	"os"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/lockstep-dev/lockstep/internal/testnet"
)

// pureACKDrop drops, in a client's network namespace, the TCP segments it sends to one address
// and port that carry nothing but an acknowledgement (flags exactly ACK): a connection's handshake
// then ends only with the client's first data, which acknowledges the SYN-ACK too.
type pureACKDrop struct {
	conn  *nftables.Conn
	ns    *os.File
	table *nftables.Table
	chain *nftables.Chain
}

// dropPureACKs installs a pureACKDrop in namespace ns for dst:port; the caller Removes it.
func dropPureACKs(t *testing.T, ns, dst string, port uint16) *pureACKDrop {
	t.Helper()
	f, err := os.Open(testnet.NetNSPath(ns))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		_ = f.Close()
		t.Fatal(err)
	}
	d := &pureACKDrop{conn: conn, ns: f}
	d.table = conn.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "vmtier-pure-acks"})
	d.chain = conn.AddChain(&nftables.Chain{Name: "out", Table: d.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter})
	portBytes := binary.BigEndian.AppendUint16(nil, port)
	conn.AddRule(&nftables.Rule{Table: d.table, Chain: d.chain, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: net.ParseIP(dst).To4()},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: portBytes},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x10}}, // ACK alone
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})
	if err := conn.Flush(); err != nil {
		_ = f.Close()
		t.Fatalf("dropping the client's pure ACKs in %s: %v", ns, err)
	}
	return d
}

// Dropped is how many segments the rule dropped so far.
func (d *pureACKDrop) Dropped(t *testing.T) uint64 {
	t.Helper()
	rules, err := d.conn.GetRules(d.table, d.chain)
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, r := range rules {
		for _, e := range r.Exprs {
			if c, ok := e.(*expr.Counter); ok {
				n += c.Packets
			}
		}
	}
	return n
}

// Remove takes the rule away (again: a no-op).
func (d *pureACKDrop) Remove() {
	if d.table == nil {
		return
	}
	d.conn.DelTable(d.table)
	_ = d.conn.Flush()
	_ = d.ns.Close()
	d.table = nil
}
