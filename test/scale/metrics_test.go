//go:build scale

package scale

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// samples is one scrape of a Prometheus text endpoint: each sample line's value by its series
// ("name{labels}" as written).
type samples map[string]float64

func scrape(url string) (samples, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("%s: %s: %s", url, resp.Status, b)
	}
	s := samples{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		s[line[:i]] = v
	}
	return s, sc.Err()
}

// sum adds the series of metric name whose labels include every one of with (`key="value"`).
func (s samples) sum(name string, with ...string) float64 {
	var total float64
	for series, v := range s {
		if matches(series, name, with) {
			total += v
		}
	}
	return total
}

func matches(series, name string, with []string) bool {
	if series != name && !strings.HasPrefix(series, name+"{") {
		return false
	}
	for _, w := range with {
		if !strings.Contains(series, w) {
			return false
		}
	}
	return true
}

// quantile estimates quantile q of histogram name (its _bucket series with labels with) as
// Prometheus's histogram_quantile does: linearly within the bucket it falls in. It takes the
// difference of two scrapes, so that it covers what happened between them.
func quantile(q float64, name string, before, after samples, with ...string) time.Duration {
	type bucket struct{ le, count float64 }
	byLE := map[float64]float64{}
	for series, v := range after {
		if !matches(series, name+"_bucket", with) {
			continue
		}
		i := strings.Index(series, `le="`)
		if i < 0 {
			continue
		}
		raw := series[i+4:]
		raw = raw[:strings.IndexByte(raw, '"')]
		le, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			continue
		}
		byLE[le] += v - before[series]
	}
	var bs []bucket
	for le, c := range byLE {
		bs = append(bs, bucket{le, c})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	if len(bs) == 0 || bs[len(bs)-1].count == 0 {
		return 0
	}
	rank := q * bs[len(bs)-1].count
	lower, below := 0.0, 0.0
	for _, b := range bs {
		if b.count >= rank {
			if math.IsInf(b.le, 1) {
				return time.Duration(lower * float64(time.Second))
			}
			frac := 0.0
			if b.count > below {
				frac = (rank - below) / (b.count - below)
			}
			return time.Duration((lower + (b.le-lower)*frac) * float64(time.Second))
		}
		lower, below = b.le, b.count
	}
	return 0
}

// usage is what a process used: its peak resident memory and its CPU time so far.
type usage struct {
	peakRSS int64 // bytes
	cpu     time.Duration
}

func (u usage) String() string {
	return fmt.Sprintf("peak %d MiB, %.1f CPU seconds", u.peakRSS>>20, u.cpu.Seconds())
}

func usageOf(pid int) (usage, error) {
	var u usage
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			u.peakRSS = kb << 10
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, err
	}
	// pid (comm) state ppid ...: utime and stime are the 14th and 15th fields, counted from
	// the pid, in clock ticks (100 a second on Linux).
	rest := string(stat[strings.LastIndexByte(string(stat), ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return u, fmt.Errorf("/proc/%d/stat: %q", pid, stat)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	u.cpu = time.Duration(ut+st) * 10 * time.Millisecond
	return u, nil
}
