package apps

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"time"
)

// PGBench is PostgreSQL's pgbench (the host's, Debian's postgresql-client-15) as load beside the
// ledger: TPC-B-like transactions on the guest's "bench" database, from the clients' namespace,
// at a fixed rate. It is load, not a check: a run that fails is reported and another started.
type PGBench struct {
	// Command makes the command that runs pgbench with these arguments (in the clients'
	// namespace).
	Command func(args ...string) *exec.Cmd
	Host    string
	Clients int
	Rate    int // transactions a second, all clients together

	mu           sync.Mutex
	runs         int
	failed       []string
	transactions int
}

func (p *PGBench) cmd(args ...string) *exec.Cmd {
	c := p.Command(append([]string{"-h", p.Host, "-U", PostgresUser}, args...)...)
	c.Env = append(os.Environ(), "PGPASSWORD="+PostgresPassword, "PGCONNECT_TIMEOUT=10")
	return c
}

// Init makes pgbench's tables (scale 1: 100,000 accounts).
func (p *PGBench) Init(ctx context.Context) error {
	if out, err := runUntil(ctx, p.cmd("-i", "-s", "1", "-q", "bench")); err != nil {
		return fmt.Errorf("pgbench -i: %w: %s", err, out)
	}
	return nil
}

var processed = regexp.MustCompile(`number of transactions actually processed: (\d+)`)

// PGBenchRunSeconds is the length of one pgbench run: each run reports what it processed when
// it ends.
const PGBenchRunSeconds = 30

// Run runs pgbench again and again until ctx ends, counting the transactions of each run and
// the runs that failed (a client aborted: its connection broke, or the server refused).
func (p *PGBench) Run(ctx context.Context) {
	for ctx.Err() == nil {
		out, err := runUntil(ctx, p.cmd("-n", "-c", strconv.Itoa(p.Clients), "-R", strconv.Itoa(p.Rate), "-T", strconv.Itoa(PGBenchRunSeconds), "bench"))
		if ctx.Err() != nil {
			return // cut short by the end: not counted
		}
		p.mu.Lock()
		p.runs++
		if m := processed.FindSubmatch(out); m != nil {
			n, _ := strconv.Atoi(string(m[1]))
			p.transactions += n
		}
		if err != nil {
			p.failed = append(p.failed, fmt.Sprintf("%v: %s", err, lastLines(out, 3)))
		}
		p.mu.Unlock()
		if err != nil {
			sleep(ctx, time.Second)
		}
	}
}

// runUntil runs c until it exits or ctx ends (then interrupts it, as pgbench reports its totals
// on SIGINT).
func runUntil(ctx context.Context, c *exec.Cmd) ([]byte, error) {
	var out syncBuffer
	c.Stdout, c.Stderr = &out, &out
	if err := c.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		return out.Bytes(), err
	case <-ctx.Done():
		_ = c.Process.Signal(os.Interrupt)
		select {
		case err := <-done:
			return out.Bytes(), err
		case <-time.After(10 * time.Second):
			_ = c.Process.Kill()
			return out.Bytes(), <-done
		}
	}
}

// Report says how many runs ended, the transactions they processed, and why runs failed.
func (p *PGBench) Report() (runs, transactions int, failed []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.runs, p.transactions, append([]string(nil), p.failed...)
}

type syncBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *syncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf...)
}

func lastLines(b []byte, n int) string {
	lines := regexp.MustCompile(`\r?\n`).Split(string(b), -1)
	var keep []string
	for i := len(lines) - 1; i >= 0 && len(keep) < n; i-- {
		if lines[i] != "" {
			keep = append([]string{lines[i]}, keep...)
		}
	}
	return fmt.Sprint(keep)
}
