//go:build fullstack

package fullstack

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
)

// BenchmarkFullStackFailover kills the primary's node FULLSTACK_KILLS times (default 20) on the
// full stack, reviving it after each, with the client asking the VM all along, and reports kill →
// the client's next reply and kill → Protected again as p50, p90 and max. The kill is the moment
// the KubeVirt double took the host off the networks.
func BenchmarkFullStackFailover(b *testing.B) {
	RegisterTestingT(b)
	kills := 20
	if n, err := fmt.Sscan(os.Getenv("FULLSTACK_KILLS"), &kills); n != 1 || err != nil {
		kills = 20
	}
	Expect(lc.Up(nodes)).To(Succeed())
	b.Cleanup(func() {
		msg, err := lc.End()
		b.Log(msg)
		Expect(err).NotTo(HaveOccurred())
	})
	var err error
	k8s, err = lc.Client(0, 0)
	Expect(err).NotTo(HaveOccurred())
	kubectl("apply", "-f", filepath.Join(lc.Root, "test", "fullstack", "testdata", "counter-vm.yaml"))
	protected()
	cl := startClient(vmAddr)
	defer cl.stop()
	Eventually(cl.Count, time.Minute, 100*time.Millisecond).Should(BeNumerically(">=", 5))

	b.ResetTimer()
	var reply, again []time.Duration
	for i := range kills {
		f := protected()
		p, s := *f.Status.Primary, *f.Status.Secondary
		killed := killNode(p.Node)
		Eventually(recordHolder, time.Minute, 20*time.Millisecond).Should(Equal(ftv1.SideIdentity(s.Node, s.VMI)))
		_, first := waitReplyAfter(cl, killed)
		protected()
		reply, again = append(reply, first.At.Sub(killed)), append(again, time.Since(killed))
		b.Logf("kill %d (%s): the next reply after %s, Protected again after %s", i+1, p.Node, reply[i].Round(time.Millisecond), again[i].Round(time.Millisecond))
		Expect(cl.Violations()).To(BeEmpty())
		reviveNode(p.Node)
	}
	b.StopTimer()
	q := func(ds []time.Duration, p float64) time.Duration {
		s := append([]time.Duration(nil), ds...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[min(len(s)-1, int(p*float64(len(s))))]
	}
	b.ReportMetric(float64(q(reply, 0.5).Milliseconds()), "ms-reply-p50")
	b.ReportMetric(float64(q(reply, 0.9).Milliseconds()), "ms-reply-p90")
	b.ReportMetric(float64(q(reply, 1).Milliseconds()), "ms-reply-max")
	b.ReportMetric(float64(q(again, 0.5).Milliseconds()), "ms-protected-p50")
	b.ReportMetric(float64(q(again, 1).Milliseconds()), "ms-protected-max")
	b.Logf("%d kills of the primary's node on the full stack: kill → the client's next reply p50 %s, p90 %s, max %s; kill → Protected again p50 %s, max %s; the client: %d replies, last count %d, no violation",
		kills, q(reply, 0.5), q(reply, 0.9), q(reply, 1), q(again, 0.5), q(again, 1), cl.Count(), cl.Last().Count)
}
