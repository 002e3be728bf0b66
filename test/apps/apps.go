// Package apps holds the clients of the real applications in lockstep's Debian test guest
// (hack/debian-guest.sh): a ledger of transfers in PostgreSQL, numbered mail through Postfix, and
// pgbench as load, each recording what the server acknowledged and checking, after a failover,
// that none of it is lost. The applications are Debian's; the clients are a published PostgreSQL
// driver (pgx), Go's SMTP client, and PostgreSQL's own pgbench. The full stack runs them against
// its protected VM (test/fullstack), from the clients' network namespace.
package apps

import (
	"context"
	"net"
)

// DialFunc opens a connection to the guest (from the clients' network namespace).
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)
