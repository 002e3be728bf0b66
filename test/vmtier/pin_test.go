//go:build linux && vmtier

package vmtier

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// pinToCore confines every thread of a process to one of the host's cores, as the kubelet's CPU
// manager confines a Guaranteed launcher pod's container to the cores it gave it (its cgroup's
// cpuset; KubeVirt's dedicatedCpuPlacement). make bench-workloads does it with WORKLOADS_PIN so
// that, on a machine of two cores, the primary has one core of its own and the secondary the
// other, as members on two hosts of one core each would: without it the secondary's QEMU takes
// its share of the very cores the unprotected VM had to itself. Threads the process starts later
// inherit the affinity of the thread that starts them.
func pinToCore(pid, core int) error {
	tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return err
	}
	var set unix.CPUSet
	set.Set(core)
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH { // ESRCH: the thread has ended
			return fmt.Errorf("pinning thread %d of %d to core %d: %w", tid, pid, core, err)
		}
	}
	return nil
}
