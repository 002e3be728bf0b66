package workloads

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/lockstep-dev/lockstep/test/apps"
)

// The OLTP rows (the white paper's two, Oracle Swingbench and SQL Server DVD Store): PostgreSQL's
// pgbench from the client on the guest's PostgreSQL 15 (its state on the data disk), four clients
// as fast as they go; transactions a second, and the latency of each transaction from pgbench's
// per-transaction log. Two of pgbench's built-in scripts:
//   - tpcb-like: each transaction also updates one of the scale's few branch rows (4), so the
//     clients wait for each other's row locks, which the two members need not grant in the same
//     order (docs/performance.md, "OLTP's timeouts");
//   - simple-update: the same transaction without the teller and branch updates, so the clients
//     almost never meet on a row (each updates one of the scale's 400,000 accounts): what
//     protection costs a database without that contention.
var (
	pgbench = pgbenchRow("oltp", "tpcb-like", "OLTP (pgbench TPC-B-like, PostgreSQL 15, 4 clients, scale 4)",
		"Oracle 11g Swingbench (80 sessions) and SQL Server 2005 DVD Store (16): negligible impact on throughput and response time")
	pgbenchSimpleUpdate = pgbenchRow("oltp-simple-update", "simple-update", "OLTP without row contention (pgbench simple-update, PostgreSQL 15, 4 clients, scale 4)",
		"the white paper's OLTP rows, above")
)

func pgbenchRow(name, script, title, paper string) Workload {
	return Workload{
		Name: name, Title: title, Paper: paper,
		// Setup makes the tables anew: the benchmark runs it before each side, so that both
		// start from the same database.
		Setup: func(ctx context.Context, env Env) error {
			scale := "4"
			if env.Brief {
				scale = "1"
			}
			if _, err := output(pgbenchCmd(ctx, env, "-i", "-s", scale, "-q", "bench")); err != nil {
				return fmt.Errorf("pgbench -i: %w", err)
			}
			return nil
		},
		Run: func(ctx context.Context, env Env) ([]Measure, error) {
			dir, err := os.MkdirTemp("", "pgbench")
			if err != nil {
				return nil, err
			}
			defer func() { _ = os.RemoveAll(dir) }()
			out, err := output(pgbenchCmd(ctx, env, "-n", "-b", script, "-c", "4", "-j", "2", "-T", strconv.Itoa(env.seconds()),
				"--log", "--log-prefix", filepath.Join(dir, "tx"), "bench"))
			if err != nil {
				return nil, err
			}
			tps, err := parsePgbenchTPS(out)
			if err != nil {
				return nil, err
			}
			lat, err := pgbenchLatencies(dir)
			if err != nil {
				return nil, err
			}
			return []Measure{
				{Name: "transactions", Unit: "tx/s", Value: tps, HigherIsBetter: true, Goal: 0.8},
				{Name: "latency p50", Unit: "ms", Value: percentile(lat, 50)},
				{Name: "latency p95", Unit: "ms", Value: percentile(lat, 95), Goal: 1.5},
			}, nil
		},
	}
}

func pgbenchCmd(ctx context.Context, env Env, args ...string) *exec.Cmd {
	c := env.Client(ctx, "pgbench", append([]string{"-h", env.Addr, "-U", apps.PostgresUser}, args...)...)
	c.Env = append(os.Environ(), "PGPASSWORD="+apps.PostgresPassword, "PGCONNECT_TIMEOUT=10")
	return c
}

var pgbenchTPS = regexp.MustCompile(`tps = ([0-9.]+)`)

// parsePgbenchTPS reads the transactions a second from pgbench's summary.
func parsePgbenchTPS(out string) (float64, error) {
	m := pgbenchTPS.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("pgbench's summary has no tps: %s", lastLine(out))
	}
	return strconv.ParseFloat(m[1], 64)
}

// pgbenchLatencies reads every transaction's latency, in milliseconds and sorted, from the
// per-transaction logs pgbench wrote into dir (--log: "client transaction latency_us script
// epoch us" a line).
func pgbenchLatencies(dir string) ([]float64, error) {
	files, err := filepath.Glob(filepath.Join(dir, "tx*"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("pgbench wrote no transaction log in %s (%v)", dir, err)
	}
	var lat []float64
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		s := bufio.NewScanner(fh)
		for s.Scan() {
			fields := strings.Fields(s.Text())
			if len(fields) < 3 {
				continue
			}
			us, err := strconv.ParseFloat(fields[2], 64)
			if err != nil { // "failed" or "skipped": no latency (none with these options)
				continue
			}
			lat = append(lat, us/1000)
		}
		_ = fh.Close()
	}
	if len(lat) == 0 {
		return nil, fmt.Errorf("pgbench's transaction logs in %s are empty", dir)
	}
	sort.Float64s(lat)
	return lat, nil
}

// percentile is the p-th percentile of sorted values (nearest rank: the smallest value with at
// least p percent of the values at or below it).
func percentile(sorted []float64, p int) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := (len(sorted)*p + 99) / 100 // ceil(n·p/100)
	return sorted[min(len(sorted)-1, max(0, rank-1))]
}
