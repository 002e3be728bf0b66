//go:build fullstack

package fullstack

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/lockstep-dev/lockstep/internal/testnet"
	"github.com/lockstep-dev/lockstep/test/apps"
)

// The guest's applications (hack/debian-guest.sh), on the VM's data disk, and their clients in
// the clients' namespace (test/apps): the ledger in PostgreSQL with pgbench as load beside it,
// numbered mail through Postfix, and SSH to read the mailbox.
const (
	vmHost         = "10.214.0.10"
	ledgerAccounts = 100
	ledgerClients  = 4 // the bank's tellers, transferring at once
	mailEvery      = time.Second
)

type guestApps struct {
	shell   *apps.Shell
	ledger  *apps.Ledger
	mail    *apps.Mail
	pgbench *apps.PGBench
	cancel  context.CancelFunc
	done    chan struct{}

	checks     int
	lastLedger apps.LedgerReport
	lastMail   apps.MailReport
}

func dialFromClients(ctx context.Context, network, addr string) (net.Conn, error) {
	return testnet.DialContext(ctx, clientNS(), network, addr)
}

func newGuestApps() *guestApps {
	shell, err := apps.NewShell(dialFromClients, net.JoinHostPort(vmHost, "22"), "lockstep")
	Expect(err).NotTo(HaveOccurred())
	return &guestApps{
		shell:  shell,
		ledger: &apps.Ledger{Dial: dialFromClients, Addr: net.JoinHostPort(vmHost, "5432"), Accounts: ledgerAccounts, Clients: ledgerClients, Seed: uint64(GinkgoRandomSeed())},
		mail:   &apps.Mail{Dial: dialFromClients, Addr: net.JoinHostPort(vmHost, "25")},
		pgbench: &apps.PGBench{Host: vmHost, Clients: 2, Rate: 5, Command: func(args ...string) *exec.Cmd {
			return exec.Command("ip", append([]string{"netns", "exec", clientNS(), "pgbench"}, args...)...)
		}},
	}
}

// vmManifest is testdata/counter-vm.yaml with the shell's key given to the guest's user, who may
// sudo (to read the mailbox), written where kubectl can apply it.
func (a *guestApps) vmManifest() string {
	in, err := os.ReadFile(filepath.Join(lc.Root, "test", "fullstack", "testdata", "counter-vm.yaml"))
	Expect(err).NotTo(HaveOccurred())
	const user = "- {name: lockstep, shell: /bin/bash, lock_passwd: true}"
	Expect(string(in)).To(ContainSubstring(user))
	out := strings.Replace(string(in), user, fmt.Sprintf(`- {name: lockstep, shell: /bin/bash, lock_passwd: true, sudo: "ALL=(ALL) NOPASSWD:ALL", ssh_authorized_keys: [%q]}`,
		a.shell.AuthorizedKey()), 1)
	f := filepath.Join(GinkgoT().TempDir(), "counter-vm.yaml")
	Expect(os.WriteFile(f, []byte(out), 0o600)).To(Succeed())
	return f
}

// start sets the applications up once the VM serves, and starts their clients.
func (a *guestApps) start() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	Expect(a.ledger.Setup(ctx)).To(Succeed(), "the ledger's tables in the guest's PostgreSQL")
	Expect(a.pgbench.Init(ctx)).To(Succeed(), "pgbench's tables")
	run, stop := context.WithCancel(context.Background())
	a.cancel, a.done = stop, make(chan struct{})
	go func() {
		defer close(a.done)
		done := make(chan struct{}, 3)
		for _, f := range []func(context.Context){a.ledger.Run, a.pgbench.Run, func(ctx context.Context) { a.mail.Run(ctx, mailEvery) }} {
			go func() { f(run); done <- struct{}{} }()
		}
		for range 3 {
			<-done
		}
	}()
	Eventually(a.mail.Accepted, 2*time.Minute, time.Second).Should(BeNumerically(">=", 3), "Postfix accepts mail")
}

// check proves that nothing the applications acknowledged is lost (test/apps: the ledger's
// transfers, balances, the server's start time and amcheck; every accepted message in the
// mailbox once, waiting for Postfix to deliver what it holds).
func (a *guestApps) check(after string) {
	if a.cancel == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := a.ledger.Check(ctx)
	Expect(err).NotTo(HaveOccurred(), func() string {
		return fmt.Sprintf("after %s, the ledger: %s; the VM's Warning events since %s:\n%s", after, r, specStart.Format("15:04:05"), vmWarnings(specStart))
	})
	var m apps.MailReport
	Eventually(func() error {
		lines, err := a.shell.Run(ctx, apps.MailboxLines)
		if err != nil {
			return err
		}
		m, err = a.mail.Check(lines)
		return err
	}, 2*time.Minute, 2*time.Second).Should(Succeed(), func() string {
		// What Postfix still holds and what it said: a message not delivered yet is there.
		diag, err := a.shell.Run(context.Background(), "sudo postqueue -p | tail -n 8; sudo journalctl -b --no-pager -n 25 -t postfix/local -t postfix/qmgr -t postfix/postfix-script; date")
		return fmt.Sprintf("after %s, the mailbox; Postfix in the guest (%v):\n%s", after, err, diag)
	})
	a.checks++
	a.lastLedger, a.lastMail = r, m
	AddReportEntry("applications after "+after, r.String()+"; "+m.String())
	GinkgoWriter.Printf("after %s: the ledger: %s; the mail: %s\n", after, r, m)
}

// restarted tells the applications' checks that the VM restarted from its disks (it ran alone and
// its node was lost): PostgreSQL went through crash recovery, and every acknowledged transfer
// must have survived it; Postfix may deliver again a message it delivered just before the stop
// (test/apps.Mail.Restarted). It waits until the restarted Postfix runs and holds nothing: the
// messages it accepted before the stop are in its queue on the data disk, and it delivers them
// only once it runs, which a guest booting under TCG on a busy machine reached minutes after the
// VM restarted (CI: 123 s after the message arrived); the mailbox check's window starts after.
func (a *guestApps) restarted() {
	if a.cancel == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	Expect(a.ledger.Restarted(ctx)).To(Succeed(), "the restarted guest's PostgreSQL")
	a.mail.Restarted()
	postfix, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	Eventually(func() (string, error) {
		return a.shell.Run(postfix, "systemctl is-active postfix@-.service; "+apps.MailQueue)
	}, 3*time.Minute, 2*time.Second).Should(MatchRegexp(`^active\s+0\s*$`), "the restarted guest's Postfix runs and has delivered what it held")
}

// stop ends the clients, checks once more, and reports the totals.
func (a *guestApps) stop() {
	if a.cancel == nil {
		return
	}
	a.check("the last step")
	a.cancel()
	<-a.done
	runs, tx, failed := a.pgbench.Report()
	fmt.Printf("applications: checked %d times; the last check: the ledger: %s; the mail: %s; pgbench beside them: %d runs of %d s, %d transactions, %d failed %v\n",
		a.checks, a.lastLedger, a.lastMail, runs, apps.PGBenchRunSeconds, tx, len(failed), failed)
}
