package virtlauncher

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// MemoryCgroup is the memory cgroup that stands for a launcher pod's compute container: kubelet
// puts the container in a cgroup with its memory limit, and everything the container runs
// (libvirt's daemon, and QEMU, which KubeVirt's qemu.conf leaves in its daemon's cgroup) is
// counted against it and killed beyond it. The double makes one under the test's own memory
// cgroup (cgroup v1 or v2).
type MemoryCgroup struct {
	// Dir is the cgroup's directory; Limit its limit in bytes.
	Dir   string
	Limit int64
	v2    bool
}

// ErrNoMemoryCgroup: this machine has no memory cgroup that the double can make one under.
var ErrNoMemoryCgroup = errors.New("no memory cgroup controller to make a launcher's cgroup under")

// NewMemoryCgroup makes the cgroup name with the given limit.
func NewMemoryCgroup(name string, limit int64) (*MemoryCgroup, error) {
	c := &MemoryCgroup{Limit: limit}
	if self, ok := selfMemoryCgroup(); ok && dirExists("/sys/fs/cgroup/memory") { // v1
		c.Dir = filepath.Join("/sys/fs/cgroup/memory", self, name)
	} else if controllers, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && hasWord(string(controllers), "memory") { // v2
		// Under the root, which alone may hold processes and children with controllers at once.
		c.Dir, c.v2 = filepath.Join("/sys/fs/cgroup", name), true
		if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+memory"), 0o644); err != nil {
			return nil, fmt.Errorf("enabling the memory controller for %s: %w", name, err)
		}
	} else {
		return nil, ErrNoMemoryCgroup
	}
	c.Remove() // one left by a run that died
	if err := os.Mkdir(c.Dir, 0o755); err != nil {
		return nil, err
	}
	file, value := "memory.limit_in_bytes", strconv.FormatInt(limit, 10)
	if c.v2 {
		file = "memory.max"
	}
	if err := os.WriteFile(filepath.Join(c.Dir, file), []byte(value), 0o644); err != nil {
		c.Remove()
		return nil, fmt.Errorf("setting %s's memory limit: %w", name, err)
	}
	if err := c.noSwap(); err != nil {
		c.Remove()
		return nil, fmt.Errorf("keeping %s out of swap: %w", name, err)
	}
	return c, nil
}

// noSwap keeps the cgroup's memory out of swap, as kubelet keeps a container's when the node's
// swap is off for pods (the default): on cgroup v1 its memory and swap together have the memory's
// limit, on v2 its swap is none. Without it, a host with swap (zram among it) would page a
// launcher out where a node kills it. Cgroup v1 without swap accounting has no such file, and
// then no swap to keep out of either way.
func (c *MemoryCgroup) noSwap() error {
	file, value := "memory.memsw.limit_in_bytes", strconv.FormatInt(c.Limit, 10)
	if c.v2 {
		file, value = "memory.swap.max", "0"
	}
	err := os.WriteFile(filepath.Join(c.Dir, file), []byte(value), 0o644)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// Procs is the file a process writes its pid to, to enter the cgroup.
func (c *MemoryCgroup) Procs() string { return filepath.Join(c.Dir, "cgroup.procs") }

// OOMKills is how many processes the kernel killed in the cgroup for going over its limit.
func (c *MemoryCgroup) OOMKills() (int, error) {
	file := "memory.oom_control" // v1: "oom_kill N" among its lines
	if c.v2 {
		file = "memory.events"
	}
	f, err := os.Open(filepath.Join(c.Dir, file))
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), " "); ok && k == "oom_kill" {
			return strconv.Atoi(v)
		}
	}
	return 0, fmt.Errorf("%s has no oom_kill count", f.Name())
}

// Peak is the most memory the cgroup has held, in bytes.
func (c *MemoryCgroup) Peak() (int64, error) {
	file := "memory.max_usage_in_bytes"
	if c.v2 {
		file = "memory.peak"
	}
	b, err := os.ReadFile(filepath.Join(c.Dir, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// Anonymous is the anonymous memory the cgroup holds now (its processes' heaps and guest RAM;
// not the page cache, which the kernel reclaims before it kills anything), in bytes.
func (c *MemoryCgroup) Anonymous() (int64, error) {
	st, err := c.Stat()
	if err != nil {
		return 0, err
	}
	return st.Anonymous, nil
}

// MemoryStat is what a cgroup holds now and how often its processes waited for a page read back
// from a file (a cgroup at its limit that the kernel does not kill reclaims its page cache, its
// programs' own code among it, and reads it back again: it thrashes).
type MemoryStat struct {
	Anonymous, PageCache, MajorFaults int64
}

// Stat reads the cgroup's memory.stat (the totals over its children, on cgroup v1).
func (c *MemoryCgroup) Stat() (MemoryStat, error) {
	keys := map[string]string{"anon": "total_rss", "file": "total_cache", "pgmajfault": "total_pgmajfault"}
	if c.v2 {
		keys = map[string]string{"anon": "anon", "file": "file", "pgmajfault": "pgmajfault"}
	}
	b, err := os.ReadFile(filepath.Join(c.Dir, "memory.stat"))
	if err != nil {
		return MemoryStat{}, err
	}
	values := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				values[k] = n
			}
		}
	}
	for _, k := range keys {
		if _, ok := values[k]; !ok {
			return MemoryStat{}, fmt.Errorf("%s/memory.stat has no %s", c.Dir, k)
		}
	}
	return MemoryStat{Anonymous: values[keys["anon"]], PageCache: values[keys["file"]], MajorFaults: values[keys["pgmajfault"]]}, nil
}

// Remove removes the cgroup once its processes are gone (a killed process leaves it a moment
// later); it gives up after a few seconds, leaving an empty cgroup behind at worst.
func (c *MemoryCgroup) Remove() {
	for range 50 {
		if err := os.Remove(c.Dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// selfMemoryCgroup is the memory cgroup (v1) this process is in.
func selfMemoryCgroup() (string, bool) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && hasWord(strings.ReplaceAll(parts[1], ",", " "), "memory") {
			return parts[2], true
		}
	}
	return "", false
}

func hasWord(s, w string) bool {
	for _, f := range strings.Fields(s) {
		if f == w {
			return true
		}
	}
	return false
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}
