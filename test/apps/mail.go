package apps

import (
	"context"
	"errors"
	"fmt"
	"net/smtp"
	"net/textproto"
	"regexp"
	"strconv"
	"sync"
	"time"
)

// MailRecipient is the guest's local mailbox (hack/debian-guest.sh); SeqHeader numbers messages.
const (
	MailRecipient = "mailbox@localhost"
	SeqHeader     = "X-Lockstep-Seq"
	// MailboxLines is the guest command that prints the numbering header of every message in
	// the mailbox.
	MailboxLines = "sudo grep -a '^" + SeqHeader + ": ' /var/mail/mailbox || true"
	// MailQueue is the guest command that prints how many messages Postfix still holds.
	MailQueue = "sudo postqueue -j | wc -l"
)

// Mail sends numbered messages to the guest's Postfix, one SMTP session each, and records every
// message the server accepted (250 after the data) and those whose data went out but whose reply
// never came (in doubt).
type Mail struct {
	Dial DialFunc
	Addr string // the server, host:port

	mu       sync.Mutex
	accepted map[int]bool
	inDoubt  map[int]bool
	refused  int
	next     int
	// restartedBefore is the first message sent after the VM last restarted from its disks
	// (0: it never did); the messages before it may be in the mailbox twice.
	restartedBefore int
}

// MailReport is what a check counted.
type MailReport struct {
	Accepted, InDoubt, Delivered, Refused int
	// Redelivered counts the messages sent before a restart of the VM that are in the mailbox
	// twice: Postfix delivers at least once across a crash (the mailbox's append is synced before
	// the queue file's removal, which a hard stop can undo), so a restart may deliver again what
	// was delivered just before it.
	Redelivered int
}

func (r MailReport) String() string {
	s := fmt.Sprintf("%d messages accepted, each in the mailbox once (%d delivered; %d in doubt, %d not accepted)",
		r.Accepted, r.Delivered, r.InDoubt, r.Refused)
	if r.Redelivered > 0 {
		s += fmt.Sprintf("; %d sent before the VM restarted from its disks delivered twice", r.Redelivered)
	}
	return s
}

// Restarted tells the checks that the VM restarted from its disks (it ran alone and was lost):
// the messages sent so far may be delivered twice, as Postfix does after a crash; none after.
func (m *Mail) Restarted() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.restartedBefore = m.next
}

// Run sends a message every interval until ctx ends.
func (m *Mail) Run(ctx context.Context, every time.Duration) {
	m.mu.Lock()
	if m.accepted == nil {
		m.accepted, m.inDoubt, m.next = map[int]bool{}, map[int]bool{}, 1
	}
	m.mu.Unlock()
	for ctx.Err() == nil {
		m.mu.Lock()
		seq := m.next
		m.next++
		m.mu.Unlock()
		sentData, err := m.send(ctx, seq)
		m.mu.Lock()
		switch {
		case err == nil:
			m.accepted[seq] = true
		case sentData:
			m.inDoubt[seq] = true
		default:
			m.refused++
		}
		m.mu.Unlock()
		sleep(ctx, every)
	}
}

// send delivers message seq; sentData says whether its data's end went out with no answer back
// (an error then leaves it in doubt), as opposed to the server refusing it or the session failing
// before.
func (m *Mail) send(ctx context.Context, seq int) (sentData bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := m.Dial(ctx, "tcp", m.Addr)
	if err != nil {
		return false, err
	}
	defer func() { _ = conn.Close() }()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	c, err := smtp.NewClient(conn, "localhost")
	if err != nil {
		return false, err
	}
	if err := c.Hello("client.lockstep.test"); err != nil {
		return false, err
	}
	if err := c.Mail("client@client.lockstep.test"); err != nil {
		return false, err
	}
	if err := c.Rcpt(MailRecipient); err != nil {
		return false, err
	}
	w, err := c.Data()
	if err != nil {
		return false, err
	}
	if _, err := fmt.Fprintf(w, "From: client@client.lockstep.test\r\nTo: %s\r\nSubject: message %d\r\n%s: %d\r\n\r\nMessage %d of lockstep's mail client.\r\n",
		MailRecipient, seq, SeqHeader, seq, seq); err != nil {
		return false, err
	}
	if err := w.Close(); err != nil {
		var refused *textproto.Error
		return !errors.As(err, &refused), err
	}
	_ = c.Quit()
	return false, nil
}

var seqLine = regexp.MustCompile(`(?m)^` + SeqHeader + `: (\d+)\s*$`)

// Check proves from the mailbox's lines (MailboxLines's output) that every accepted message is
// there, and no message twice but one sent before the VM restarted from its disks (Restarted),
// and that one no more than twice.
func (m *Mail) Check(mailbox string) (MailReport, error) {
	delivered := map[int]int{}
	for _, sub := range seqLine.FindAllStringSubmatch(mailbox, -1) {
		n, _ := strconv.Atoi(sub[1])
		delivered[n]++
	}
	m.mu.Lock()
	accepted := copySet(m.accepted)
	r := MailReport{Accepted: len(m.accepted), InDoubt: len(m.inDoubt), Delivered: len(delivered), Refused: m.refused}
	restartedBefore := m.restartedBefore
	m.mu.Unlock()
	var errs []error
	have := map[int]bool{}
	var twice []int
	for n, count := range delivered {
		have[n] = true
		switch {
		case count == 2 && n < restartedBefore:
			r.Redelivered++
		case count > 1:
			twice = append(twice, n)
		}
	}
	if missing := missingFrom(accepted, have); len(missing) > 0 {
		errs = append(errs, fmt.Errorf("%d accepted messages are not in the mailbox: %v", len(missing), head(missing)))
	}
	if len(twice) > 0 {
		errs = append(errs, fmt.Errorf("%d messages are in the mailbox more than once: %v", len(twice), head(twice)))
	}
	return r, errors.Join(errs...)
}

// Accepted is how many messages the server accepted so far.
func (m *Mail) Accepted() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.accepted)
}
