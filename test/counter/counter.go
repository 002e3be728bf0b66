// Package counter is the client of the test guest's counter (hack/guest): one request, one reply
// "count=N bootid=ID disk=count=M", where N counts the requests the guest answered since its
// first boot, ID names the boot and M is what its disk holds after the write that N made (the
// Debian guest adds "by=", the counts before N with the client address that made each). It
// checks what FT promises a client of the VM: the count never goes back and never loses a value
// the client saw, the VM never reboots, and the disk holds what the client was told.
package counter

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"time"

	"github.com/lockstep-dev/lockstep/internal/testnet"
)

// Port is the counter's TCP port.
const Port = 7777

// Reply is one answer of the counter.
type Reply struct {
	Count  int
	BootID string
	Disk   int
	At     time.Time
	// From is the client's own address on the request's connection; By, when the guest says it,
	// the counts before this one and the client address that made each ("N@addr,...").
	From, By string
}

var reply = regexp.MustCompile(`^count=(\d+) bootid=(\S+) disk=count=(\d+)(?: by=(\S+))?`)

// Ask sends one request to the counter at addr (ip:port) from inside network namespace ns.
func Ask(ctx context.Context, ns, addr string) (Reply, error) {
	return AskDialing(ctx, ns, addr, 0)
}

// AskDialing is Ask by a client that gives each connection attempt at most dialTimeout (0: up to
// the request's 5 s, through the kernel's own SYN retransmissions, the first of which comes a
// second after the SYN). A client that expects a failover retries sooner than that.
func AskDialing(ctx context.Context, ns, addr string, dialTimeout time.Duration) (Reply, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	dctx := ctx
	if dialTimeout > 0 {
		var cancelDial context.CancelFunc
		dctx, cancelDial = context.WithTimeout(ctx, dialTimeout)
		defer cancelDial()
	}
	var c net.Conn
	var err error
	if ns == "" {
		c, err = (&net.Dialer{}).DialContext(dctx, "tcp", addr)
	} else {
		c, err = testnet.DialContext(dctx, ns, "tcp", addr)
	}
	if err != nil {
		return Reply{}, err
	}
	defer func() { _ = c.Close() }()
	return AskOn(c)
}

// AskOn sends one request to the counter on the connection c, and reads its reply.
func AskOn(c net.Conn) (Reply, error) {
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write([]byte("next\n")); err != nil {
		return Reply{}, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return Reply{}, err
	}
	m := reply.FindStringSubmatch(line)
	if m == nil {
		return Reply{}, fmt.Errorf("unexpected reply %q", line)
	}
	r := Reply{BootID: m[2], At: time.Now(), From: c.LocalAddr().String(), By: m[4]}
	r.Count, _ = strconv.Atoi(m[1])
	r.Disk, _ = strconv.Atoi(m[3])
	return r, nil
}

// Checker follows one client's replies.
type Checker struct {
	// Last is the last count the client saw; Boot the boot id of the last reply, LastAt when it
	// came, LastFrom the client's address on its connection.
	Last     int
	Boot     string
	LastAt   time.Time
	LastFrom string
	// unanswered counts the requests since the last reply that got none: each may or may not
	// have reached the VM, so the next count may be up to that many beyond Last+1.
	unanswered int
}

// Failed records a request that got no reply.
func (c *Checker) Failed() { c.unanswered++ }

// Check checks a reply against what the client saw before, and records it. A reboot is reported
// once, with the gap before it (how long the VM did not answer, and how often it was asked).
func (c *Checker) Check(r Reply) error {
	if c.Boot == "" {
		c.Boot, c.Last, c.LastAt, c.unanswered = r.BootID, r.Count-1, r.At, 0
	}
	var err error
	switch {
	case r.BootID != c.Boot:
		err = fmt.Errorf("the VM rebooted: boot id %s after %s, whose last reply came at %s; %d requests unanswered in the %s between",
			r.BootID, c.Boot, c.LastAt.Format("15:04:05.000"), c.unanswered, r.At.Sub(c.LastAt).Round(time.Millisecond))
	case r.Count <= c.Last:
		err = fmt.Errorf("the count went back: %d after %d", r.Count, c.Last)
	case r.Count > c.Last+1+c.unanswered:
		err = fmt.Errorf("the count skipped: %d after %d with %d unanswered requests%s", r.Count, c.Last, c.unanswered, c.whoCounted(r))
	case r.Disk != r.Count:
		err = fmt.Errorf("the disk holds count=%d, the reply count=%d", r.Disk, r.Count)
	}
	c.Last, c.Boot, c.LastAt, c.LastFrom, c.unanswered = r.Count, r.BootID, r.At, r.From, 0
	return err
}

// whoCounted says, when the guest names them, which connections made the counts before r: a count
// the client skipped was made by a connection it did not see answered.
func (c *Checker) whoCounted(r Reply) string {
	if r.By == "" {
		return ""
	}
	return fmt.Sprintf(" (this reply on %s; %d came on %s; the guest says the counts before were made by %s)", r.From, c.Last, c.LastFrom, r.By)
}
