//go:build linux && vmtier

package vmtier

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/failover"
	"github.com/lockstep-dev/lockstep/internal/testnet"
	"github.com/lockstep-dev/lockstep/test/workloads"
)

// debianWithApps is the real guest's workloads variant with its data disk, where PostgreSQL and
// Postfix run.
var debianWithApps = guest{debian: true, vcpus: 2, dataDisk: true, workloads: true}

// workloadEnv is where test/workloads' drivers run against the cluster's VM: the guest over ssh,
// the clients in the client's namespace.
func (c *cluster) workloadEnv(t testing.TB, span time.Duration, brief bool) workloads.Env {
	return workloads.Env{
		Guest: func(ctx context.Context, command string) (string, error) {
			cmd := c.debian.sshContext(ctx, c.client, c.vmAddr, command)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				return string(out) + stderr.String(), err
			}
			return string(out), nil
		},
		Client: func(ctx context.Context, name string, args ...string) *exec.Cmd {
			return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", c.client, name}, args...)...)
		},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return testnet.DialContext(ctx, c.client, network, addr)
		},
		Addr: c.vmAddr, Span: span, Brief: brief,
		SMTPSource: build(t, "smtp-source.sh"),
	}
}

// bootWithApps boots the Debian guest with its data disk on a primary, unprotected, and waits
// until PostgreSQL and Postfix run on it.
func bootWithApps(t testing.TB, nodes int, vcpus int) (*cluster, *member) {
	g := debianWithApps
	g.vcpus = vcpus
	c, _, p := bootOf(t, nodes, viaLibvirt, g)
	booted := time.Now()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		out, err := c.debian.ssh(c.client, c.vmAddr, "systemctl is-active postgresql@15-main postfix@-").CombinedOutput()
		if err == nil {
			// Active is not yet listening: a row that ran first once found port 25 refused.
			if err = listening(c, "25", "5432"); err == nil {
				break
			}
			out = nil
		}
		if time.Now().After(deadline) {
			c.dump()
			t.Fatalf("PostgreSQL and Postfix are not running on the guest's data disk: %v: %s", err, out)
		}
		time.Sleep(2 * time.Second)
	}
	t.Logf("the guest's applications run %s after its first reply", time.Since(booted).Round(time.Second))
	return c, p
}

// listening says whether the guest accepts TCP connections from the client on each of ports.
func listening(c *cluster, ports ...string) error {
	for _, port := range ports {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := testnet.DialContext(ctx, c.client, "tcp", net.JoinHostPort(c.vmAddr, port))
		cancel()
		if err != nil {
			return err
		}
		_ = conn.Close()
	}
	return nil
}

// TestLibvirtWorkloadDrivers runs each of test/workloads' drivers once, briefly, against the
// Debian guest unprotected: the programs are in the guest and on the client's side, the drivers
// read what they print. It measures nothing worth keeping (make bench-workloads does).
func TestLibvirtWorkloadDrivers(t *testing.T) {
	c, _ := bootWithApps(t, 1, debianWithApps.vcpus)
	env := c.workloadEnv(t, 0, true)
	ctx := context.Background()
	for _, w := range workloads.All() {
		if w.Setup != nil {
			if err := w.Setup(ctx, env); err != nil {
				t.Fatalf("%s: %v", w.Name, err)
			}
		}
		ms, err := w.Run(ctx, env)
		if err == nil {
			err = workloads.Check(w, ms)
		}
		if err != nil {
			t.Fatalf("%s: %v", w.Name, err)
		}
		t.Logf("%s: %v", w.Name, ms)
	}
}

// BenchmarkWorkloads is the white paper's table on lockstep (make bench-workloads): every
// workload of test/workloads on the Debian guest in KubeVirt's domain through the libvirt stack,
// first unprotected, then on the same VM protected, side by side in one run; with what the
// protection did during each (checkpoints a second and why, bytes to the secondary, the pause).
// It writes the report to WORKLOADS_OUT (default bin/bench/workloads.json), for
// hack/benchreport. WORKLOADS_SPAN (a Go duration, default 20s) is each timed row's length;
// WORKLOADS_VCPUS (default 1) the guest's vCPUs: on a machine of two cores, one each keeps the
// secondary's vCPU off the primary's core; WORKLOADS_ONLY runs the workloads whose names it
// lists (comma-separated). WORKLOADS_PIN=1 gives the VM's QEMU (unprotected, then as the
// primary) the first core and the secondary's QEMU the second (pinToCore): two hosts of one core
// each, where by default both QEMUs share both cores.
func BenchmarkWorkloads(b *testing.B) {
	span := 20 * time.Second
	if d, err := time.ParseDuration(os.Getenv("WORKLOADS_SPAN")); err == nil {
		span = d
	}
	vcpus := 1
	if v, err := strconv.Atoi(os.Getenv("WORKLOADS_VCPUS")); err == nil && v > 0 {
		vcpus = v
	}
	pin := os.Getenv("WORKLOADS_PIN") == "1"
	if pin && runtime.NumCPU() < 2 {
		b.Fatal("WORKLOADS_PIN needs two cores")
	}
	out := os.Getenv("WORKLOADS_OUT")
	if out == "" {
		out = filepath.Join(root, "bin", "bench", "workloads.json")
	}
	var run []workloads.Workload
	only := map[string]bool{}
	for _, n := range strings.Split(os.Getenv("WORKLOADS_ONLY"), ",") {
		if n != "" {
			only[n] = true
		}
	}
	for _, w := range workloads.All() {
		if len(only) == 0 || only[w.Name] {
			run = append(run, w)
		}
	}

	c, p := bootWithApps(b, 2, vcpus)
	if pin {
		if err := pinToCore(p.pid, 0); err != nil {
			b.Fatal(err)
		}
	}
	env := c.workloadEnv(b, span, false)
	ctx := context.Background()
	// measureAll runs every row, protected where s (the secondary) is set; it returns each row's
	// measures, the protection's window and the CPU the host, the QEMUs and the relays used.
	measureAll := func(s *member) (map[string][]workloads.Measure, map[string]window, map[string][]float64) {
		protected := s != nil
		results, windows, cpu := map[string][]workloads.Measure{}, map[string]window{}, map[string][]float64{}
		pids := []int{p.pid, os.Getpid()}
		if protected {
			pids = append(pids, s.pid)
		}
		for _, w := range run { // each side starts from the same tables and files
			if w.Setup != nil {
				if err := w.Setup(ctx, env); err != nil {
					b.Fatalf("%s (protected: %v): %v", w.Name, protected, err)
				}
			}
		}
		for _, w := range run {
			var ms []workloads.Measure
			var err error
			do := func() { ms, err = w.Run(ctx, env) }
			// The counters first: the ssh that reads the guest's is no part of the row's CPU.
			tcpBefore, guestBefore := clientTCPCounters(b, c.client), guestTCPCounters(ctx, b, env)
			meter := startCPUMeter(pids...)
			if protected {
				win := c.measure(p, 0, do)
				windows[w.Name] = win
				// for benchreport -colotrace -from -to, on a trace kept by VMTIER_LOGS
				b.Logf("%s protected from %s to %s", w.Name, win.start.UTC().Format(time.RFC3339Nano), win.start.Add(win.elapsed).UTC().Format(time.RFC3339Nano))
				c.stillProtected(b, p, w.Name, win)
			} else {
				do()
			}
			host, procs := meter.read()
			cpu[w.Name] = append([]float64{host}, procs...)
			if err == nil {
				err = workloads.Check(w, ms)
			}
			if err != nil {
				b.Fatalf("%s (protected: %v): %v", w.Name, protected, err)
			}
			tcp, guest := countersSince(clientTCPCounters(b, c.client), tcpBefore), countersSince(guestTCPCounters(ctx, b, env), guestBefore)
			b.Logf("%s, protected %v: %v; the client's TCP: %d segments queued out of order, %d received twice, %d sent again on duplicate acknowledgements; "+
				"the guest's: %d queued out of order, %d received twice, %d sent again on duplicate acknowledgements, %d dropped by TCP, %d by the kernel's backlog, %d by its NIC",
				w.Name, protected, ms, tcp["TCPOFOQueue"], tcp["TCPDSACKOldSent"], tcp["TCPFastRetrans"],
				guest["TCPOFOQueue"], guest["TCPDSACKOldSent"], guest["TCPFastRetrans"],
				guest["TCPBacklogDrop"]+guest["TCPRcvQDrop"]+guest["TCPOFODrop"], guest["BacklogDropped"], guest["NICDropped"])
			results[w.Name] = ms
		}
		return results, windows, cpu
	}
	alone, _, cpuAlone := measureAll(nil)
	start := time.Now()
	s := c.protect(p, c.nodes[1])
	b.Logf("protected %s after the secondary started", time.Since(start).Round(time.Millisecond))
	if pin {
		if err := pinToCore(s.pid, 1); err != nil {
			b.Fatal(err)
		}
	}
	ft, windows, cpuFT := measureAll(s)

	report := workloads.Report{
		Date: time.Now().UTC().Format(time.RFC3339), Commit: commit(), Machine: machine(),
		Guest: fmt.Sprintf("Debian 12, hack/debian-guest.sh's workloads variant, in KubeVirt's domain through libvirt, %d vCPU, %d MiB, a root and a %d MiB data disk on claims (raw), virtio-net; QEMU TCG",
			vcpus, debianMemoryMB, debianDataDiskSize>>20),
		Span: span.String(), Pinned: pin,
	}
	for _, w := range run {
		win := windows[w.Name]
		a, f := cpuAlone[w.Name], cpuFT[w.Name] // host, primary, relays (, secondary)
		cpu := workloads.CPU{Cores: runtime.NumCPU(), HostUnprotected: a[0], PrimaryUnprotected: a[1], RelaysUnprotected: a[2],
			HostProtected: f[0], Primary: f[1], Relays: f[2], Secondary: f[3]}
		b.Logf("%-22s CPU (cores of %d): the host %.2f -> %.2f; the primary's QEMU %.2f -> %.2f, the secondary's %.2f, the relays %.2f -> %.2f",
			w.Name, cpu.Cores, cpu.HostUnprotected, cpu.HostProtected, cpu.PrimaryUnprotected, cpu.Primary, cpu.Secondary, cpu.RelaysUnprotected, cpu.Relays)
		for i, m := range alone[w.Name] {
			row := workloads.Row{Workload: w.Name, Title: w.Title, Paper: w.Paper, Measure: m, Unprotected: m.Value, Protected: ft[w.Name][i].Value,
				Protection: workloads.Window{Seconds: win.elapsed.Seconds(), Checkpoints: win.checkpoints, CheckpointsPerSecond: win.checkpointsPerSecond,
					OnMismatch: win.onMismatch, OnTimeout: win.onTimeout, OnCrossed: win.onCrossed, LogMBps: win.bytesPerSec / 1e6, StreamMBps: win.streamMBps,
					PauseP50Ms: ms(win.pauseP50), PauseP90Ms: ms(win.pauseP90)}, CPU: cpu}
			row.Measure.Value = 0 // the row has both
			report.Rows = append(report.Rows, row)
			b.Logf("%-22s %-16s %10.2f -> %10.2f %-6s kept %.2f (goal met: %v); %.2f checkpoints/s (%s), %.1f MB/s to the secondary, %s",
				w.Name, m.Name, row.Unprotected, row.Protected, m.Unit, row.Kept(), row.GoalMet(), win.checkpointsPerSecond, win.causes(), win.bytesPerSec/1e6, win.pauses())
		}
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := report.Write(out); err != nil {
		b.Fatal(err)
	}
	b.Logf("the report: %s (go run ./hack/benchreport %s)", out, out)
}

// stillProtected fails the benchmark where a row's protected run was not protected all along: the
// primary left the pair, or the checkpoints stopped for three periods (a run of 9e514ce measured
// its last rows with no checkpoint at all, and would have reported them as protection's cost).
func (c *cluster) stillProtected(b *testing.B, p *member, row string, w window) {
	if st := p.agent.State(); st != failover.Protected {
		c.dump()
		b.Fatalf("%s: the primary is %s after its protected run, not Protected: the row was not measured protected", row, st)
	}
	if w.longestGap > 3*checkpoint {
		c.dump()
		b.Fatalf("%s: %s without a checkpoint in its protected run (%d checkpoints in %s), where the period is %s: the pair did not replicate all along",
			row, w.longestGap.Round(time.Second), w.checkpoints, w.elapsed.Round(time.Second), checkpoint)
	}
}

// commit is the tree the benchmark ran: its commit, marked where the tree differs from it.
func commit() string {
	out, err := exec.Command("git", "-C", root, "describe", "--always", "--dirty", "--abbrev=7").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// machine says what the benchmark ran on: the CPU, its cores, the memory, and no KVM.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.Atoi(f[1])
				mem = fmt.Sprintf(", %d GiB", (kb+(1<<19))>>20)
			}
		}
	}
	return fmt.Sprintf("%s, %d cores%s, no KVM (both members on one host)", model, runtime.NumCPU(), mem)
}
