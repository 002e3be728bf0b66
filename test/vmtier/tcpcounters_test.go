//go:build linux && vmtier

package vmtier

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/lockstep-dev/lockstep/test/workloads"
)

// clientTCPCounters reads the TcpExt counters of the namespace ns (/proc/net/netstat) by name,
// without the prefix: TCPOFOQueue counts the segments its TCP queued because they came out of
// order, TCPDSACKOldSent the segments it received again, TCPFastRetrans those it sent again on
// duplicate acknowledgements.
func clientTCPCounters(t testing.TB, ns string) map[string]int64 {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/proc/net/netstat").Output()
	if err != nil {
		t.Fatalf("the client's TCP counters: %v", err)
	}
	counters, err := parseNetstat(string(out), "TcpExt")
	if err != nil {
		t.Fatal(err)
	}
	return counters
}

// countersSince is what each counter of after (clientTCPCounters, guestTCPCounters) counted
// since before.
func countersSince(after, before map[string]int64) map[string]int64 {
	d := make(map[string]int64, len(after))
	for name, n := range after {
		d[name] = n - before[name]
	}
	return d
}

// guestTCPCounters reads the guest's TcpExt counters as clientTCPCounters reads the client's.
func guestTCPCounters(ctx context.Context, tb testing.TB, env workloads.Env) map[string]int64 {
	tb.Helper()
	// Beside TCP's counters, what the guest's kernel dropped before TCP: its NICs' receive drops,
	// and its backlog's (/proc/net/softnet_stat's second column, in hexadecimal).
	out, err := env.Guest(ctx, `cat /proc/net/netstat; d=0; while read -r _ b _; do d=$((d + 0x$b)); done < /proc/net/softnet_stat; `+
		`n=0; for f in /sys/class/net/*/statistics/rx_dropped; do n=$((n + $(cat "$f"))); done; `+
		`printf 'Dropped: Backlog Receive\nDropped: %d %d\n' "$d" "$n"`)
	if err != nil {
		tb.Fatalf("the guest's TCP counters: %v: %s", err, out)
	}
	counters, err := parseNetstat(out, "TcpExt")
	if err != nil {
		tb.Fatal(err)
	}
	dropped, err := parseNetstat(out, "Dropped")
	if err != nil {
		tb.Fatal(err)
	}
	counters["BacklogDropped"], counters["NICDropped"] = dropped["Backlog"], dropped["Receive"]
	return counters
}

// parseNetstat reads one group of /proc/net/netstat: a line of names after "Group:", then a line
// of values after it.
func parseNetstat(text, group string) (map[string]int64, error) {
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		names := strings.Fields(sc.Text())
		if len(names) == 0 || names[0] != group+":" {
			continue
		}
		if !sc.Scan() {
			break
		}
		values := strings.Fields(sc.Text())
		if len(values) != len(names) || values[0] != group+":" {
			return nil, fmt.Errorf("/proc/net/netstat: %s's values do not follow its names", group)
		}
		m := map[string]int64{}
		for i := 1; i < len(names); i++ {
			v, err := strconv.ParseInt(values[i], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("/proc/net/netstat: %s %s: %w", group, names[i], err)
			}
			m[names[i]] = v
		}
		return m, nil
	}
	return nil, fmt.Errorf("/proc/net/netstat has no %s", group)
}
