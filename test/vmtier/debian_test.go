//go:build linux && vmtier

package vmtier

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	virtv1 "kubevirt.io/api/core/v1"

	"github.com/lockstep-dev/lockstep/internal/colo"
)

// debianGuest is the real guest (hack/debian-guest.sh): Debian 12 booting from its own disk
// (syslinux on the EFI system partition, for SeaBIOS and OVMF), systemd, cloud-init taking its
// hostname, its user and its address from the NoCloud ISO that the launcher writes, sshd,
// qemu-guest-agent, and the counter as a systemd service (lockstep-counter) that keeps its count on the
// disk's partition labelled counter and fsyncs it before every reply, on IPv4 and IPv6.
type debianGuest struct {
	disk string // the image hack/debian-guest.sh built; each primary runs on a copy
	size int64  // the disk's size: the secondary's copy and the COLO overlays have it too
	// key is the test's ssh key; the user-data authorizes its public half (key.pub) for debianUser.
	key string
}

const (
	debianUser     = "lockstep"
	debianHostname = "counter-1"
	debianMemoryMB = 512
	// debianDataDiskSize is the Debian guest's data disk, where the VM has one: PostgreSQL's and
	// Postfix's state, and the disk workloads' file (test/workloads).
	debianDataDiskSize = 1 << 30
	// debianCounterOffset is where the counter's partition starts on the disk: after the first
	// MiB and the 64 MiB EFI system partition (hack/debian-guest.sh's layout).
	debianCounterOffset = 65 << 20
)

// newDebianGuest is the Debian guest; with workloads, its variant that holds the programs of
// test/workloads (DEBIAN_GUEST_VARIANT=workloads).
func newDebianGuest(t testing.TB, workloads bool) *debianGuest {
	t.Helper()
	var variant []string
	if workloads {
		variant = []string{"DEBIAN_GUEST_VARIANT=workloads"}
	}
	dir := build(t, "debian-guest.sh", variant...)
	g := &debianGuest{disk: filepath.Join(dir, "disk.img"), key: filepath.Join(t.TempDir(), "key")}
	st, err := os.Stat(g.disk)
	if err != nil {
		t.Fatal(err)
	}
	g.size = st.Size()
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vmtier", "-f", g.key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	return g
}

// vm is the guest's QEMU: no kernel of its own (the firmware boots the disk), the counter's
// address from cloud-init, not the command line.
func (g *debianGuest) vm(qemu, dir, name string) colo.VM {
	return colo.VM{
		Firmware: []string{filepath.Join(qemu, "firmware", "qemu"), filepath.Join(qemu, "firmware", "seabios")},
		MemoryMB: debianMemoryMB, Tap: "tap0", MAC: guestMAC,
		QMP: filepath.Join(dir, name+".qmp"), Serial: filepath.Join(dir, name+".console"),
	}
}

// copyDisk gives a primary its claim: a sparse copy of the built image.
func (g *debianGuest) copyDisk(t testing.TB, to string) {
	t.Helper()
	if out, err := exec.Command("cp", "--sparse=always", g.disk, to).CombinedOutput(); err != nil {
		t.Fatalf("copying the guest's disk: %v\n%s", err, out)
	}
}

// cloudInit is the VMI's cloudInitNoCloud volume: the user with the test's key, and the address.
func (g *debianGuest) cloudInit(t testing.TB, addr string) virtv1.Volume {
	t.Helper()
	pub, err := os.ReadFile(g.key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	user := fmt.Sprintf("#cloud-config\nusers:\n  - name: %s\n    shell: /bin/bash\n    sudo: ALL=(ALL) NOPASSWD:ALL\n    ssh_authorized_keys:\n      - %s\n",
		debianUser, strings.TrimSpace(string(pub)))
	network := fmt.Sprintf("version: 2\nethernets:\n  eth0:\n    addresses: [%s/24]\n", addr)
	return virtv1.Volume{Name: "cloudinit", VolumeSource: virtv1.VolumeSource{
		CloudInitNoCloud: &virtv1.CloudInitNoCloudSource{UserData: user, NetworkData: network}}}
}

// ssh runs command in the guest as debianUser over ssh from the namespace ns, with the test's
// key, returning the command (not started).
func (g *debianGuest) ssh(ns, addr, command string) *exec.Cmd {
	return g.sshContext(context.Background(), ns, addr, command)
}

// sshContext is ssh, killed when ctx ends.
func (g *debianGuest) sshContext(ctx context.Context, ns, addr, command string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", "netns", "exec", ns, "ssh", "-i", g.key, "-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10",
		"-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=6", // a guest silent for 30 s is gone
		debianUser+"@"+addr, command)
}

// session is an ssh session to the guest whose remote command prints a numbered line with a
// fresh random UUID every 100 ms: its output differs on the two sides (each guest draws its own
// random numbers), so colo-compare finds the primary's packets differ from the secondary's and
// asks for a checkpoint, again and again, while the counter is served. Its client reads every
// line: COLO's output commit promises that it sees each line once, in order, across a failover.
type session struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []time.Time // when line i+1 arrived
	bad   string      // the first line out of order
	done  chan struct{}
}

func (g *debianGuest) startSession(t testing.TB, ns, addr string) *session {
	t.Helper()
	s := &session{done: make(chan struct{}),
		cmd: g.ssh(ns, addr, `i=0; while [ $i -lt 100000 ]; do i=$((i+1)); echo "$i $(cat /proc/sys/kernel/random/uuid)"; sleep 0.1; done`)}
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	s.cmd.Stderr = &stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.cmd.Process.Kill(); <-s.done })
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			s.mu.Lock()
			if n, _, _ := strings.Cut(sc.Text(), " "); n != fmt.Sprint(len(s.lines)+1) && s.bad == "" {
				s.bad = fmt.Sprintf("line %q after line %d", sc.Text(), len(s.lines))
			}
			s.lines = append(s.lines, time.Now())
			s.mu.Unlock()
		}
		_ = s.cmd.Wait()
		s.mu.Lock()
		if s.bad == "" {
			s.bad = fmt.Sprintf("the session ended after line %d: %s", len(s.lines), strings.TrimSpace(stderr.String()))
		}
		s.mu.Unlock()
	}()
	return s
}

// linesSince is how many lines arrived after at.
func (s *session) linesSince(at time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range s.lines {
		if l.After(at) {
			n++
		}
	}
	return n
}

// waitLines waits until n lines arrived after at, and fails the test if a line came out of order
// or the session ended.
func (s *session) waitLines(t testing.TB, n int, at time.Time, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		s.mu.Lock()
		bad, all := s.bad, len(s.lines)
		s.mu.Unlock()
		if bad != "" {
			t.Fatalf("the ssh session: %s", bad)
		}
		if s.linesSince(at) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ssh session gave %d lines in %s after %s (%d in all)", s.linesSince(at), limit, at.Format(time.StampMilli), all)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkRealGuest checks the real guest on the primary p and the secondary s: both QEMUs run two
// vCPUs; in the guest (over ssh), cloud-init took the hostname and the user from the NoCloud ISO,
// systemd runs the counter and the guest agent with nothing failed; the guest agent answers
// libvirt on the primary.
func (c *cluster) checkRealGuest(p, s *member) {
	t := c.t
	t.Helper()
	for _, m := range []*member{p, s} {
		var cpus []map[string]any
		if err := m.launcher.Execute(context.Background(), "query-cpus-fast", nil, &cpus); err != nil || len(cpus) != 2 {
			t.Fatalf("%s has %d vCPUs (%v), want 2", m.name, len(cpus), err)
		}
	}
	out, err := c.debian.ssh(c.client, c.vmAddr, "hostname; id -un; nproc; systemctl is-active lockstep-counter qemu-guest-agent; systemctl --failed --no-legend --plain | wc -l").CombinedOutput()
	want := fmt.Sprintf("%s\n%s\n2\nactive\nactive\n0\n", debianHostname, debianUser)
	if err != nil || string(out) != want {
		t.Fatalf("in the guest: %v\n%s\nwant:\n%s", err, out, want)
	}
	// libvirt holds a domain "not running" for the pause of each checkpoint (one Suspended and
	// one Resumed event a checkpoint): an agent command that meets one is asked again.
	var ping string
	for try := 0; try < 20; try++ {
		if ping, err = p.lv.Virsh("qemu-agent-command", domainName(p), `{"execute":"guest-ping"}`); err == nil || !strings.Contains(err.Error(), "domain is not running") {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil || !strings.Contains(ping, `"return"`) {
		t.Fatalf("the guest agent: %v %s", err, ping)
	}
}

// fillMemory has the guest hold mib MiB of its memory in random data (a file on a tmpfs of its
// own), so that each of those pages is dirty on the primary and lands in the secondary's RAM at
// the next checkpoint. Not zeros: migration sends them as zero pages, which a page that is still
// zero takes without being touched. Not a repeated text either: a host that runs KSM (KubeVirt
// turns it on for nodes it selects) merges its few distinct pages into one copy each, in both
// QEMUs. It returns what the guest says of its memory then.
func (g *debianGuest) fillMemory(t testing.TB, ns, addr string, mib int) string {
	t.Helper()
	out, err := g.ssh(ns, addr, fmt.Sprintf("sudo mount -t tmpfs -o size=%dm fill /mnt && head -c %dM /dev/urandom >/mnt/fill && grep -E 'MemTotal|MemAvailable|Shmem:' /proc/meminfo | tr -s ' \\n' ' '",
		mib+8, mib)).CombinedOutput()
	if err != nil {
		t.Fatalf("filling the guest's memory: %v\n%s", err, out)
	}
	return strings.TrimSpace(string(out))
}
