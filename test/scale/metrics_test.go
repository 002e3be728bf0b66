//go:build scale

package scale

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
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
		raw, ok := labelValue(series, "le")
		if !ok {
			continue
		}
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

// usage is what a process used: its peak resident memory, the peak of its anonymous part (its
// heap and stacks, sampled while the run went on: the resident figure also counts the binary's
// pages mapped from the page cache), its CPU time so far, and the memory limit of its cgroup, if
// it runs in one with a limit (hack/local-cluster.sh gives the operator its Deployment's).
type usage struct {
	peakRSS  int64 // bytes
	peakAnon int64 // bytes; zero when not sampled
	cpu      time.Duration
	// limit and cgroupPeak are zero outside a limited memory cgroup.
	limit, cgroupPeak int64
}

func (u usage) String() string {
	s := fmt.Sprintf("peak %d MiB", u.peakRSS>>20)
	if u.peakAnon > 0 {
		s += fmt.Sprintf(" (anonymous %d MiB)", u.peakAnon>>20)
	}
	if u.limit > 0 {
		s += fmt.Sprintf("; its cgroup's peak %d MiB under its %d MiB limit", u.cgroupPeak>>20, u.limit>>20)
	}
	return s + fmt.Sprintf(", %.1f CPU seconds", u.cpu.Seconds())
}

// cgroupMemory reads the limit of the process's memory cgroup and the most it has charged
// (v1 limit_in_bytes and max_usage_in_bytes, v2 memory.max and memory.peak): what the kernel
// holds against the limit, as the kubelet sees a container. Zero when it has no cgroup of its
// own.
func cgroupMemory(pid int) (limit, peak int64) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return 0, 0
	}
	read := func(path string) int64 {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return n
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[1] == "memory":
			dir := "/sys/fs/cgroup/memory" + f[2]
			limit, peak = read(dir+"/memory.limit_in_bytes"), read(dir+"/memory.max_usage_in_bytes")
		case f[0] == "0" && f[1] == "" && limit == 0:
			dir := "/sys/fs/cgroup" + f[2]
			limit, peak = read(dir+"/memory.max"), read(dir+"/memory.peak")
		}
	}
	// An unlimited cgroup reads as a huge number (v1) or "max" (v2, parsed as 0): not ours.
	if limit >= 1<<50 || limit == 0 {
		return 0, 0
	}
	return limit, peak
}

// anonSampler keeps the peak of a process's anonymous resident memory (RssAnon), read every
// 100 ms until stop.
type anonSampler struct {
	peak int64 // written by the sampling goroutine only; read once done is closed
	stop chan struct{}
	done chan struct{}
}

func sampleAnon(pid int) *anonSampler {
	a := &anonSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(a.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			a.peak = max(a.peak, statusField(pid, "RssAnon:"))
			select {
			case <-a.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return a
}

// Peak stops the sampling and returns the peak seen.
func (a *anonSampler) Peak() int64 {
	close(a.stop)
	<-a.done
	return a.peak
}

// statusField reads a size field of /proc/PID/status (in kB there) in bytes; 0 if absent.
func statusField(pid int, name string) int64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == name {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func usageOf(pid int) (usage, error) {
	var u usage
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
		return u, err
	}
	u.peakRSS = statusField(pid, "VmHWM:")
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
	u.limit, u.cgroupPeak = cgroupMemory(pid)
	return u, nil
}

// profileCPU, when SCALE_PROFILE names a directory, records the operator's CPU profile from now
// until the returned function is called (at most ten minutes) in DIR/PHASE.cpu.NN.pprof, 10 s
// each, and its heap then in DIR/PHASE.heap.pprof; read them together with
// `go tool pprof bin/lockstep-operator DIR/PHASE.cpu.*.pprof`.
func profileCPU(ctx context.Context, t *testing.T, phase string) (stop func()) {
	dir := os.Getenv("SCALE_PROFILE")
	if dir == "" {
		return func() {}
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	fetch := func(ctx context.Context, path, file string) {
		if err := fetchTo(ctx, "http://"+pprofAddr+path, filepath.Join(dir, file)); err != nil {
			t.Logf("profile %s: %v", file, err)
		}
	}
	go func() {
		defer close(done)
		// A cancelled profile request loses the profile, so it runs in slices of 10 s; the
		// last one may overrun the phase by up to 10 s.
		for i := 0; pctx.Err() == nil && i < 60; i++ {
			fetch(ctx, "/debug/pprof/profile?seconds=10", fmt.Sprintf("%s.cpu.%02d.pprof", phase, i))
		}
	}()
	return func() {
		cancel()
		<-done
		fetch(ctx, "/debug/pprof/heap", phase+".heap.pprof")
	}
}

// fetchTo writes what url answers to file.
func fetchTo(ctx context.Context, url, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o644)
}

// labelValue reads label's value from a series as scraped (`name{a="x",b="y"}`).
func labelValue(series, label string) (string, bool) {
	i := strings.Index(series, label+`="`)
	if i < 0 {
		return "", false
	}
	v := series[i+len(label)+2:]
	return v[:strings.IndexByte(v, '"')], true
}

// byLabels sums counter name between two scrapes by the values of labels, largest first, e.g.
// "POST 201: 2000, PATCH 200: 1500".
func byLabels(before, after samples, name string, labels ...string) string {
	sums := map[string]float64{}
	for series, v := range after {
		if !matches(series, name, nil) {
			continue
		}
		var key []string
		for _, l := range labels {
			val, _ := labelValue(series, l)
			key = append(key, val)
		}
		sums[strings.Join(key, " ")] += v - before[series]
	}
	keys := make([]string, 0, len(sums))
	for k, v := range sums {
		if v > 0 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return sums[keys[i]] > sums[keys[j]] })
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = fmt.Sprintf("%s: %.0f", k, sums[k])
	}
	return strings.Join(out, ", ")
}
