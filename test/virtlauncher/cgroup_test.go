package virtlauncher

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestMemoryCgroupCountsWhatItsProcessHolds: a process in the cgroup that fills 64 MiB of its
// heap shows in the cgroup's anonymous memory and its peak.
func TestMemoryCgroupCountsWhatItsProcessHolds(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a memory cgroup needs root")
	}
	cg, err := NewMemoryCgroup("lockstep-cgroup-test-"+strconv.Itoa(os.Getpid()), 256<<20)
	if errors.Is(err, ErrNoMemoryCgroup) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Remove()
	// The shell enters the cgroup, then holds 64 MiB in a variable until it reads a line.
	cmd := exec.Command("sh", "-c", `echo $$ >"$1" && python3 -c 'import sys; b = bytearray(64 << 20); b[::4096] = b"x" * len(b[::4096]); sys.stdout.write("full\n"); sys.stdout.flush(); sys.stdin.readline()'`, "sh", cg.Procs())
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stdin.Close(); _ = cmd.Wait() }()
	if _, err := stdout.Read(make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	st, err := cg.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if st.Anonymous < 64<<20 || st.Anonymous > 256<<20 {
		t.Fatalf("the cgroup holds %d MiB anonymous memory, want between 64 and 256", st.Anonymous>>20)
	}
	if peak, err := cg.Peak(); err != nil || peak < st.Anonymous {
		t.Fatalf("peak %d, %v; want at least the %d anonymous bytes held", peak, err, st.Anonymous)
	}
	if kills, err := cg.OOMKills(); err != nil || kills != 0 {
		t.Fatalf("%d OOM kills (%v), want none", kills, err)
	}
	// No swap beyond the limit, as kubelet leaves a container (where the kernel counts swap).
	file, want := "memory.memsw.limit_in_bytes", strconv.FormatInt(cg.Limit, 10)
	if cg.v2 {
		file, want = "memory.swap.max", "0"
	}
	if b, err := os.ReadFile(filepath.Join(cg.Dir, file)); err == nil && strings.TrimSpace(string(b)) != want {
		t.Fatalf("%s is %s, want %s", file, strings.TrimSpace(string(b)), want)
	}
}
