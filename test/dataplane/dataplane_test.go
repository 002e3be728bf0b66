//go:build linux

package dataplane

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"
	coordinationv1 "k8s.io/api/coordination/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/lockstepd"
	"github.com/lockstep-dev/lockstep/test/vmdouble"
)

// checkInvariants reads what the observer saw and what each VM applied, and checks:
//   - never two live sides: the outputs of one VM never interleave with another's;
//   - nothing lost: each VM's outputs grow, and a VM that takes over starts above everything
//     its predecessor showed;
//   - no entry lost or applied twice: within one log, a secondary applies every value once, in order;
//   - output commit: every output a protected primary released was held by another side first.
func checkInvariants(t testing.TB, c *cluster) {
	t.Helper()
	outs := c.obs.all()
	if len(outs) == 0 {
		t.Fatal("the observer saw no output")
	}
	var runs []string
	prevMax := map[string]uint64{}
	var lastVM string
	var runMax uint64
	for _, o := range outs {
		if o.vm != lastVM {
			for _, r := range runs {
				if r == o.vm {
					t.Fatalf("outputs of %s resumed after another VM's: two sides were live (runs %v, then %s %d)", o.vm, runs, o.vm, o.v)
				}
			}
			if lastVM != "" && o.v <= runMax {
				t.Fatalf("%s took over at %d, but %s had shown %d: outputs were lost", o.vm, o.v, lastVM, runMax)
			}
			runs, lastVM = append(runs, o.vm), o.vm
		} else if o.v <= prevMax[o.vm] {
			t.Fatalf("%s showed %d after %d: outputs out of order or twice", o.vm, o.v, prevMax[o.vm])
		}
		prevMax[o.vm], runMax = o.v, o.v
	}

	applies := readTraces(t, c)
	last := map[string]applied{}
	for _, a := range applies {
		if p, ok := last[a.vm]; ok && a.seq != 1 && (a.seq != p.seq+1 || a.v != p.v+1) {
			t.Fatalf("%s applied entry %d (value %d) after entry %d (value %d): an entry was lost or applied twice", a.vm, a.seq, a.v, p.seq, p.v)
		}
		last[a.vm] = a
	}

	sort.Slice(applies, func(i, j int) bool { return applies[i].mono < applies[j].mono })
	checked := 0
	for _, o := range outs {
		if !c.obs.checked(o) {
			continue
		}
		held := false
		for _, a := range applies {
			if a.mono >= o.mono {
				break
			}
			if a.vm != o.vm && a.v >= o.v {
				held = true
				break
			}
		}
		if !held {
			t.Fatalf("%s released output %d before any other side held it", o.vm, o.v)
		}
		checked++
	}
	t.Logf("invariants hold: %d outputs in runs %v, %d applied entries, %d gated outputs checked against the secondary", len(outs), runs, len(applies), checked)
}

func traceHas(t testing.TB, c *cluster, line string) bool {
	for _, nd := range c.nodes {
		b, err := os.ReadFile(nd.trace)
		if err == nil && strings.Contains(string(b), line+"\n") {
			return true
		}
	}
	return false
}

// TestKill9PrimaryFailsOverWithNothingLost kills the primary's lockstepd (and so its VM): the
// secondary goes live from the Lease, continues above every output clients saw, and is
// protected again by a new secondary on a third node.
func TestKill9PrimaryFailsOverWithNothingLost(t *testing.T) {
	c := newCluster(t, 3)
	c.protect()
	_, epoch := c.lease()
	if code, body := c.get(c.nodes[0], "http://127.0.0.1:9411/readyz"); code != 200 {
		t.Fatalf("readyz of the primary's lockstepd: %d %s", code, body)
	}
	_, metrics := c.get(c.nodes[0], "http://127.0.0.1:9410/metrics")
	for _, want := range []string{`lockstepd_side_state{pair="` + c.ns + `/vm",state="Protected",vmi="a"} 1`, `lockstepd_log_bytes_total{pair="` + c.ns + `/vm",vmi="a"}`,
		"lockstepd_certificate_expiration_timestamp_seconds "} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("the primary's metrics lack %s:\n%s", want, metrics)
		}
	}

	killed := vmdouble.Monotonic()
	c.kill(c.nodes[0])
	eventually(t, "the secondary goes live", 10*time.Second, func() bool { return c.obs.count("b") > 0 })
	live := c.obs.all()
	for _, o := range live {
		if o.vm == "b" {
			t.Logf("kill -9 to the first output of the secondary: %s", time.Duration(o.mono-killed).Round(time.Millisecond))
			break
		}
	}
	holder, e := c.lease()
	if holder != c.nodes[1].name+"/b" || e != epoch+1 {
		t.Fatalf("Lease held by %s at epoch %d, want %s/b at %d", holder, e, c.nodes[1].name, epoch+1)
	}
	eventually(t, "the live secondary reports Alone", 5*time.Second, func() bool {
		p := c.primaryReport()
		return p != nil && p.VMI == "b" && p.State == "Alone" && c.secondaryReport() == nil
	})

	c.promote("b")
	c.member("c", ftv1.RoleSecondary, c.nodes[2])
	c.start(c.nodes[2])
	eventually(t, "protection resumes with the new secondary", 20*time.Second, func() bool {
		p, s := c.primaryReport(), c.secondaryReport()
		return p != nil && p.VMI == "b" && p.State == "Protected" && s != nil && s.VMI == "c" && s.Synchronized
	})
	c.obs.markProtected("b")
	eventually(t, "outputs of the protected new primary", 10*time.Second, func() bool { return c.obs.count("b") > c.obs.protectedFrom("b")+100 })
	f := c.ftvm()
	if f.Status.VLockstepInterval == nil || f.Status.VLockstepInterval.Duration <= 0 {
		t.Fatalf("no vLockstep interval reported: %+v", f.Status)
	}
	checkInvariants(t, c)
}

// TestFaultsInTheLogPath injects delay and cut connections into the FT log path (no failover
// may follow), then stalls it (exactly one side may go on).
func TestFaultsInTheLogPath(t *testing.T) {
	c := newCluster(t, 2)
	c.protect()
	_, epoch := c.lease()
	px := c.nodes[1].proxy
	steady := func(what string, d time.Duration) {
		t.Helper()
		before := c.obs.count("a")
		time.Sleep(d)
		if _, e := c.lease(); e != epoch {
			t.Fatalf("%s: the Lease moved to epoch %d", what, e)
		}
		if p := c.primaryReport(); p == nil || p.VMI != "a" || p.State != "Protected" {
			t.Fatalf("%s: primary report %+v, want a Protected", what, p)
		}
		if after := c.obs.count("a"); after < before+200 {
			t.Fatalf("%s: only %d outputs in %s", what, after-before, d)
		}
	}
	add := func(name, typ, stream string, attrs toxiproxy.Attributes) {
		t.Helper()
		if _, err := px.AddToxic(name, typ, stream, 1, attrs); err != nil {
			t.Fatal(err)
		}
	}
	remove := func(names ...string) {
		t.Helper()
		for _, n := range names {
			if err := px.RemoveToxic(n); err != nil {
				t.Fatal(err)
			}
		}
	}

	add("delay-up", "latency", "upstream", toxiproxy.Attributes{"latency": 2})
	add("delay-down", "latency", "downstream", toxiproxy.Attributes{"latency": 2})
	steady("2 ms each way", 2*time.Second)
	remove("delay-up", "delay-down")

	// Every connection is cut after 4 KiB: the primary reconnects and resumes, over and over.
	add("cut", "limit_data", "upstream", toxiproxy.Attributes{"bytes": 4096})
	steady("connections cut every 4 KiB", 3*time.Second)
	remove("cut")

	// A stall: the path stays open but carries nothing. Both sides stop hearing each other.
	c.obs.faultNow("a")
	add("stall-up", "timeout", "upstream", toxiproxy.Attributes{"timeout": 0})
	add("stall-down", "timeout", "downstream", toxiproxy.Attributes{"timeout": 0})
	winner := c.oneSideWins(epoch)
	t.Logf("after the stall %s went on alone", winner)
	checkInvariants(t, c)
}

// oneSideWins waits until the Lease moved on and the loser fenced itself: its VM stopped and
// its VMI deleted. It returns the winner.
func (c *cluster) oneSideWins(epoch int32) string {
	c.t.Helper()
	var holder string
	eventually(c.t, "a side wins the Lease", 10*time.Second, func() bool {
		var e int32
		holder, e = c.lease()
		return e == epoch+1
	})
	winner, loser := "a", "b"
	if strings.HasSuffix(holder, "/b") {
		winner, loser = "b", "a"
	}
	eventually(c.t, "the loser stops its VM and deletes its VMI", 10*time.Second, func() bool {
		return traceHas(c.t, c, loser+" stop") && !c.vmiExists(loser)
	})
	eventually(c.t, "the winner runs alone", 5*time.Second, func() bool {
		p := c.primaryReport()
		return p != nil && p.VMI == winner && p.State == "Alone"
	})
	before := c.obs.count(winner)
	eventually(c.t, "the winner's outputs flow", 5*time.Second, func() bool { return c.obs.count(winner) > before+100 })
	return winner
}

// TestPartitionBetweenNodes cuts the logging link while both nodes still reach the API server:
// exactly one side goes on.
func TestPartitionBetweenNodes(t *testing.T) {
	c := newCluster(t, 2)
	c.protect()
	_, epoch := c.lease()
	c.obs.faultNow("a")
	c.nodes[0].data.SetDown(t, true)
	winner := c.oneSideWins(epoch)
	t.Logf("after the partition %s went on alone", winner)
	checkInvariants(t, c)
}

// TestPrimaryCutOffFromEverything isolates the primary's node from its peer and from the API
// server (its clients still reach it): it cannot win the Lease, so it releases nothing more, and
// it stops once it has claimed until its term's stop point (at most T - T/12, 27.5 s, after its
// last renewal); the secondary goes live meanwhile.
func TestPrimaryCutOffFromEverything(t *testing.T) {
	c := newCluster(t, 2)
	c.protect()
	_, epoch := c.lease()
	c.nodes[0].api(false)
	c.nodes[0].data.SetDown(t, true)
	eventually(t, "the secondary goes live", 10*time.Second, func() bool { return c.obs.count("b") > 100 })
	if holder, e := c.lease(); holder != c.nodes[1].name+"/b" || e != epoch+1 {
		t.Fatalf("Lease %s at %d", holder, e)
	}
	eventually(t, "the isolated primary stops its VM", time.Minute, func() bool { return traceHas(t, c, "a stop") })
	c.nodes[0].api(true)
	eventually(t, "the fenced primary deletes its VMI once the API server is back", 20*time.Second, func() bool { return !c.vmiExists("a") })
	checkInvariants(t, c)
}

// TestAPIServerDownDuringPartition partitions the pair while neither side reaches the API
// server: nobody goes live, and nothing unacknowledged leaves. The secondary stops after its claim
// timeout, the primary at its term's stop point.
func TestAPIServerDownDuringPartition(t *testing.T) {
	c := newCluster(t, 2)
	c.protect()
	c.nodes[0].api(false)
	c.nodes[1].api(false)
	c.nodes[0].data.SetDown(t, true)
	eventually(t, "both sides stop", time.Minute, func() bool { return traceHas(t, c, "a stop") && traceHas(t, c, "b stop") })
	stopped := c.obs.count("a")
	time.Sleep(time.Second)
	if c.obs.count("b") != 0 || c.obs.count("a") != stopped {
		t.Fatalf("outputs after both sides were fenced: a %d -> %d, b %d", stopped, c.obs.count("a"), c.obs.count("b"))
	}
	c.nodes[0].api(true)
	c.nodes[1].api(true)
	eventually(t, "both fenced members delete their VMIs", 20*time.Second, func() bool { return !c.vmiExists("a") && !c.vmiExists("b") })
	checkInvariants(t, c)
}

// TestGracefulShutdown stops the secondary's lockstepd with SIGTERM: it exits cleanly and at
// once, and the primary, which no longer hears it, wins the Lease and goes on alone.
func TestGracefulShutdown(t *testing.T) {
	c := newCluster(t, 2)
	c.protect()
	_, epoch := c.lease()
	sec := c.nodes[1].cmd
	c.obs.faultNow("a")
	if err := sec.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sec.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("lockstepd exited with %v after SIGTERM", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("lockstepd did not exit within 10s of SIGTERM")
	}
	eventually(t, "the primary goes on alone", 10*time.Second, func() bool {
		p := c.primaryReport()
		_, e := c.lease()
		return p != nil && p.VMI == "a" && p.State == "Alone" && e == epoch+1
	})
	checkInvariants(t, c)

	// It left the pair it kept protected to the next lockstepd on its node, which is not ready
	// (a DaemonSet's rollout waits) until the VM is protected again.
	ledger, err := os.ReadFile(filepath.Join(c.runDir(c.nodes[1]), "reprotection-ledger.json"))
	if err != nil || !strings.Contains(string(ledger), `"pair":"`+c.ns+`/vm","secondary":"b"`) {
		t.Fatalf("the reprotection ledger: %q, %v; want the pair %s/vm, protected by b", ledger, err, c.ns)
	}
	c.start(c.nodes[1])
	var body string
	eventually(t, "the next lockstepd answers, not ready, for the VM it awaits", 20*time.Second, func() bool {
		var code int
		code, body = c.get(c.nodes[1], "http://127.0.0.1:9411/readyz?verbose")
		return code == http.StatusInternalServerError && strings.Contains(body, "reprotection failed")
	})
	if _, m := c.get(c.nodes[1], "http://127.0.0.1:9410/metrics"); !strings.Contains(m, "lockstepd_reprotection_awaited_vms 1") {
		t.Fatalf("the next lockstepd's metrics do not count the VM it awaits:\n%s", m)
	}
	// What the operator writes once a new secondary ("c") is synchronized; the primary's
	// lockstepd writes its reports beside it.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		f := c.ftvm()
		f.Status.Secondary = &ftv1.MemberStatus{VMI: "c", Node: c.nodes[1].name}
		apimeta.SetStatusCondition(&f.Status.Conditions, metav1.Condition{Type: ftv1.ConditionProtected, Status: metav1.ConditionTrue,
			Reason: ftv1.ReasonProtected, Message: "a new secondary is synchronized"})
		return k8s.Status().Update(context.Background(), f)
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the next lockstepd is ready once the VM is protected again", 20*time.Second, func() bool {
		code, _ := c.get(c.nodes[1], "http://127.0.0.1:9411/readyz")
		return code == http.StatusOK
	})
	if _, err := os.Stat(filepath.Join(c.runDir(c.nodes[1]), "reprotection-ledger.json")); !os.IsNotExist(err) {
		t.Fatalf("the ledger outlived the wait: %v", err)
	}
}

// TestOperatorMovesTheRecordWhileBothSidesRun: the node lifecycle, not lockstepd, declared the
// primary's node lost (its kubelet died; its lockstepd and VM did not). The operator does what
// controllers/failover.go does: it moves the pair's record (the Lease) to the secondary by
// compare-and-set, labels the primary fenced, and then the secondary primary. The primary's
// lockstepd stops its VM; the secondary's finds its claim already made and goes live; nothing the
// clients saw is lost, and the two never both release output.
func TestOperatorMovesTheRecordWhileBothSidesRun(t *testing.T) {
	c := newCluster(t, 2)
	c.protect()
	l := &coordinationv1.Lease{}
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: c.ns, Name: lockstepd.LeaseName("vm")}, l); err != nil {
		t.Fatal(err)
	}
	epoch := *l.Spec.LeaseTransitions + 1
	identity := ftv1.SideIdentity(c.nodes[1].name, "b")
	l.Spec.HolderIdentity, l.Spec.LeaseTransitions = &identity, &epoch
	if err := k8s.Update(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	c.relabel("a", ftv1.RoleFenced)
	c.promote("b")

	eventually(t, "the secondary goes live", 10*time.Second, func() bool { return c.obs.count("b") > 0 })
	seen := c.obs.count("a")
	time.Sleep(time.Second)
	if now := c.obs.count("a"); now != seen {
		t.Fatalf("the fenced primary still released outputs: %d, then %d", seen, now)
	}
	if holder, e := c.lease(); holder != identity || e != epoch {
		t.Fatalf("Lease held by %s at epoch %d, want %s at %d (the secondary's claim was the operator's)", holder, e, identity, epoch)
	}
	eventually(t, "the live secondary reports Alone", 5*time.Second, func() bool {
		p := c.primaryReport()
		return p != nil && p.VMI == "b" && p.State == "Alone"
	})
	checkInvariants(t, c)
}

// TestOperatorFencesAPrimary: a member the operator labels fenced (it does not hold the pair's
// record) is stopped by its lockstepd at once, which deletes its VMI; its secondary, no longer
// hearing it, wins the Lease and goes live, with nothing the clients saw lost.
func TestOperatorFencesAPrimary(t *testing.T) {
	c := newCluster(t, 2)
	c.protect()
	_, epoch := c.lease()
	c.relabel("a", ftv1.RoleFenced)
	eventually(t, "the fenced primary stops its VM", 10*time.Second, func() bool {
		n := c.obs.count("a")
		time.Sleep(300 * time.Millisecond)
		return c.obs.count("a") == n
	})
	// A fenced side's lockstepd deletes its VMI. (Its Fenced report is soon overwritten by the
	// live secondary's, which takes the primary's place in status.replication.)
	eventually(t, "its lockstepd fences it and deletes its VMI", 10*time.Second, func() bool { return !c.vmiExists("a") })
	eventually(t, "the secondary goes live", 10*time.Second, func() bool { return c.obs.count("b") > 0 })
	if holder, e := c.lease(); holder != ftv1.SideIdentity(c.nodes[1].name, "b") || e != epoch+1 {
		t.Fatalf("Lease held by %s at epoch %d, want the secondary at %d", holder, e, epoch+1)
	}
	checkInvariants(t, c)
}
