package apps

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The guest's PostgreSQL role, password and database of the ledger (hack/debian-guest.sh).
const (
	PostgresUser     = "lockstep"
	PostgresPassword = "lockstep"
	ledgerDB         = "ledger"
	initialBalance   = 1000
)

// Ledger is a bank: its clients move money between accounts in the guest's PostgreSQL at once,
// one transaction per transfer (debit, credit, a row naming the transfer), and it records every
// transfer whose COMMIT the server acknowledged, and those whose COMMIT was sent but never
// answered (in doubt: either outcome is allowed). A transfer's number is never used twice.
type Ledger struct {
	Dial     DialFunc
	Addr     string // the server, host:port
	Accounts int
	Seed     uint64
	// Clients is how many clients transfer at once, each on its own connection (default 1).
	Clients int

	mu      sync.Mutex
	acked   map[int64]bool
	inDoubt map[int64]bool
	failed  map[int64]bool // transfers that failed before COMMIT (rolled back)
	next    int64
	started time.Time // pg_postmaster_start_time() when the ledger was set up
}

// LedgerReport is what a check counted.
type LedgerReport struct {
	Acknowledged, InDoubt, Present, Failed int
	Balance                                int64
}

func (r LedgerReport) String() string {
	return fmt.Sprintf("%d transfers acknowledged, all present (%d rows; %d in doubt, %d failed before COMMIT), balances summing to %d",
		r.Acknowledged, r.Present, r.InDoubt, r.Failed, r.Balance)
}

func (l *Ledger) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable&connect_timeout=10",
		PostgresUser, PostgresPassword, l.Addr, ledgerDB))
	if err != nil {
		return nil, err
	}
	cfg.DialFunc = pgconn.DialFunc(l.Dial)
	return pgx.ConnectConfig(ctx, cfg)
}

// connectRetrying connects, retrying until ctx ends (the guest may still be booting).
func (l *Ledger) connectRetrying(ctx context.Context) (*pgx.Conn, error) {
	for {
		c, err := l.connect(ctx)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connecting to PostgreSQL at %s: %w", l.Addr, err)
		case <-time.After(time.Second):
		}
	}
}

// Setup makes the accounts (each with the same balance) and the transfers' table, and records
// when the server started.
func (l *Ledger) Setup(ctx context.Context) error {
	c, err := l.connectRetrying(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close(context.Background()) }()
	for _, sql := range []string{
		`CREATE TABLE IF NOT EXISTS accounts (id int PRIMARY KEY, balance bigint NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS transfers (id bigint PRIMARY KEY, src int NOT NULL, dst int NOT NULL,
			amount bigint NOT NULL, at timestamptz NOT NULL DEFAULT now())`,
		fmt.Sprintf(`INSERT INTO accounts SELECT g, %d FROM generate_series(1, %d) g ON CONFLICT DO NOTHING`, initialBalance, l.Accounts),
	} {
		if _, err := c.Exec(ctx, sql); err != nil {
			return fmt.Errorf("setting up the ledger: %w", err)
		}
	}
	var next int64
	var started time.Time
	if err := c.QueryRow(ctx, `SELECT coalesce(max(id), 0) + 1, pg_postmaster_start_time() FROM transfers`).Scan(&next, &started); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.acked, l.inDoubt, l.failed, l.next, l.started = map[int64]bool{}, map[int64]bool{}, map[int64]bool{}, next, started
	return nil
}

// Run runs the clients until ctx ends.
func (l *Ledger) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for i := range max(1, l.Clients) {
		wg.Add(1)
		go func() { defer wg.Done(); l.client(ctx, uint64(i)+1) }()
	}
	wg.Wait()
}

// Restarted takes the server's new start time after the VM restarted from its disks, as it may
// when it ran alone: PostgreSQL went through crash recovery, and Check still proves that every
// acknowledged transfer survived it.
func (l *Ledger) Restarted(ctx context.Context) error {
	c, err := l.connectRetrying(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close(context.Background()) }()
	var started time.Time
	if err := c.QueryRow(ctx, `SELECT pg_postmaster_start_time()`).Scan(&started); err != nil {
		return err
	}
	l.mu.Lock()
	l.started = started
	l.mu.Unlock()
	return nil
}

// client makes transfers until ctx ends, reconnecting after any error.
func (l *Ledger) client(ctx context.Context, n uint64) {
	rng := rand.New(rand.NewPCG(l.Seed, n))
	var c *pgx.Conn
	defer func() {
		if c != nil {
			_ = c.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		if c == nil {
			var err error
			if c, err = l.connect(ctx); err != nil {
				sleep(ctx, 500*time.Millisecond)
				continue
			}
		}
		l.mu.Lock()
		id := l.next
		l.next++
		l.mu.Unlock()
		src := 1 + rng.IntN(l.Accounts)
		dst := 1 + (src+rng.IntN(l.Accounts-1))%l.Accounts
		committed, err := transfer(ctx, c, id, src, dst, 1+rng.Int64N(50))
		l.mu.Lock()
		switch {
		case err == nil:
			l.acked[id] = true
		case committed:
			l.inDoubt[id] = true
		default:
			l.failed[id] = true
		}
		l.mu.Unlock()
		if err != nil {
			_ = c.Close(context.Background())
			c = nil
		}
	}
}

// transfer runs one transfer; sentCommit says whether COMMIT went out (so that an error leaves
// its outcome in doubt).
func transfer(ctx context.Context, c *pgx.Conn, id int64, src, dst int, amount int64) (sentCommit bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tx, err := c.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	// The two accounts in the order of their numbers, so that concurrent transfers never wait
	// for each other's rows in a cycle.
	first, firstDelta, second, secondDelta := src, -amount, dst, amount
	if dst < src {
		first, firstDelta, second, secondDelta = dst, amount, src, -amount
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`UPDATE accounts SET balance = balance + $1 WHERE id = $2`, []any{firstDelta, first}},
		{`UPDATE accounts SET balance = balance + $1 WHERE id = $2`, []any{secondDelta, second}},
		{`INSERT INTO transfers (id, src, dst, amount) VALUES ($1, $2, $3, $4)`, []any{id, src, dst, amount}},
	} {
		if _, err := tx.Exec(ctx, q.sql, q.args...); err != nil {
			return false, err
		}
	}
	return true, tx.Commit(ctx)
}

// Check connects anew and proves that nothing acknowledged is lost: every acknowledged transfer
// is there and no transfer the client did not make; the balances still sum to what the accounts
// started with; the server never restarted (no crash recovery: its start time is the one Setup
// saw); and PostgreSQL's own checks (amcheck: every B-tree index against its table, each table's
// heap) find nothing.
func (l *Ledger) Check(ctx context.Context) (LedgerReport, error) {
	c, err := l.connectRetrying(ctx)
	if err != nil {
		return LedgerReport{}, err
	}
	defer func() { _ = c.Close(context.Background()) }()
	l.mu.Lock()
	acked, inDoubt := copySet(l.acked), copySet(l.inDoubt)
	r := LedgerReport{Acknowledged: len(acked), InDoubt: len(inDoubt), Failed: len(l.failed)}
	started := l.started
	l.mu.Unlock()

	var errs []error
	present := map[int64]bool{}
	rows, err := c.Query(ctx, `SELECT id FROM transfers`)
	if err != nil {
		return r, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return r, err
	}
	for _, id := range ids {
		present[id] = true
	}
	r.Present = len(present)
	if missing := missingFrom(acked, present); len(missing) > 0 {
		errs = append(errs, fmt.Errorf("%d acknowledged transfers are gone: %v", len(missing), head(missing)))
	}
	// A transfer still under way when the rows were read may be there; one that failed before
	// its COMMIT, or that no client made, may not.
	var strange []int64
	l.mu.Lock()
	for id := range present {
		if l.failed[id] || id >= l.next {
			strange = append(strange, id)
		}
	}
	l.mu.Unlock()
	if len(strange) > 0 {
		sort.Slice(strange, func(i, j int) bool { return strange[i] < strange[j] })
		errs = append(errs, fmt.Errorf("%d transfers are there that the client saw fail before COMMIT, or never made: %v", len(strange), head(strange)))
	}
	var accounts int
	if err := c.QueryRow(ctx, `SELECT count(*), coalesce(sum(balance), 0) FROM accounts`).Scan(&accounts, &r.Balance); err != nil {
		return r, err
	}
	if want := int64(l.Accounts) * initialBalance; accounts != l.Accounts || r.Balance != want {
		errs = append(errs, fmt.Errorf("%d accounts holding %d in all, not %d holding %d", accounts, r.Balance, l.Accounts, want))
	}
	var now time.Time
	if err := c.QueryRow(ctx, `SELECT pg_postmaster_start_time()`).Scan(&now); err != nil {
		return r, err
	}
	if !now.Equal(started) {
		errs = append(errs, fmt.Errorf("the server restarted (started %s, not %s): it went through crash recovery", now, started))
	}
	if _, err := c.Exec(ctx, `SELECT bt_index_check(i.indexrelid, true) FROM pg_index i
		WHERE i.indrelid IN ('accounts'::regclass, 'transfers'::regclass)`); err != nil {
		errs = append(errs, fmt.Errorf("amcheck, the indexes: %w", err))
	}
	for _, table := range []string{"accounts", "transfers"} {
		var corrupt int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM verify_heapam($1::regclass)`, table).Scan(&corrupt); err != nil {
			errs = append(errs, fmt.Errorf("amcheck, table %s: %w", table, err))
		} else if corrupt > 0 {
			errs = append(errs, fmt.Errorf("amcheck found %d corruptions in table %s", corrupt, table))
		}
	}
	return r, errors.Join(errs...)
}

func copySet[K comparable](m map[K]bool) map[K]bool {
	out := make(map[K]bool, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// missingFrom lists, in order, the members of want that have is lacks.
func missingFrom[K int64 | int](want, have map[K]bool) []K {
	var out []K
	for k := range want {
		if !have[k] {
			out = append(out, k)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// head is at most the first 20 of s, for a message.
func head[K any](s []K) []K {
	if len(s) > 20 {
		return s[:20]
	}
	return s
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
