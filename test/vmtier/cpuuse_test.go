//go:build linux && vmtier

package vmtier

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// cpuMeter reads how much CPU the host and some processes used from its start to its read, in
// cores (1: one core busy all along). make bench-workloads reports it beside each row: on a
// machine where both members share the cores, a row whose protected run keeps the host busy is
// bound by the secondary's share of the host, which two hosts would not share.
type cpuMeter struct {
	host  hostTicks
	procs []int
	ticks []uint64
	start time.Time
}

// hostTicks is /proc/stat's first line: the ticks all cores spent busy, and in all.
type hostTicks struct{ busy, all uint64 }

func startCPUMeter(pids ...int) *cpuMeter {
	m := &cpuMeter{host: readHostTicks(), procs: pids, start: time.Now()}
	for _, pid := range pids {
		m.ticks = append(m.ticks, readProcTicks(pid))
	}
	return m
}

// read returns the host's busy cores and each process's, in the order startCPUMeter took them.
// A process's ticks are converted with the host's own tick rate over the same time, so that no
// USER_HZ is assumed.
func (m *cpuMeter) read() (host float64, procs []float64) {
	now, elapsed := readHostTicks(), time.Since(m.start).Seconds()
	all := float64(now.all - m.host.all)
	if all <= 0 || elapsed <= 0 {
		return 0, make([]float64, len(m.procs))
	}
	cores := float64(runtime.NumCPU())
	host = float64(now.busy-m.host.busy) / all * cores
	perSecond := all / cores / elapsed // ticks a second of one core
	for i, pid := range m.procs {
		procs = append(procs, float64(readProcTicks(pid)-m.ticks[i])/perSecond/elapsed)
	}
	return host, procs
}

// readHostTicks reads the host's busy and total ticks: user, nice, system, irq, softirq and
// steal are busy (a guest's time is in user already); idle and iowait are not.
func readHostTicks() hostTicks {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return hostTicks{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var t hostTicks
	for i, v := range f[1:min(len(f), 9)] {
		n, _ := strconv.ParseUint(v, 10, 64)
		t.all += n
		if i != 3 && i != 4 { // idle, iowait
			t.busy += n
		}
	}
	return t
}

// readProcTicks reads the user and system ticks of a process (all its threads); 0 where it has
// gone.
func readProcTicks(pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command sits in parentheses and may hold spaces; the fields after it start at the state.
	_, rest, ok := strings.Cut(string(b), ") ")
	if !ok {
		return 0
	}
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseUint(f[11], 10, 64)
	stime, _ := strconv.ParseUint(f[12], 10, 64)
	return utime + stime
}
