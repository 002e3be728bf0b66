//go:build fullstack

// Package fullstack runs every part of lockstep together on the local cluster of
// hack/local-cluster.sh with FULL_STACK=1: the real kube-apiserver, etcd, controller manager and
// scheduler with kwok nodes; the operator with --colo; on each node's host (a network namespace)
// lockstepd as its DaemonSet runs it, with its pod's token and its certificate from the
// operator's signer; and each member VMI booted on its node's host by the KubeVirt double through
// lockstep's hook and a libvirt daemon of its own, with real QEMU and the counter guest. A client
// in its own namespace asks the VM's counter all along. Nodes die as hosts do: their heartbeats,
// links, QEMUs and lockstepd all at once.
//
//	make test-fullstack            # brings up the cluster "lockstep-fs", runs, tears it down
//	FULLSTACK_KEEP=1 make test-fullstack
package fullstack

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/term"
	"github.com/lockstep-dev/lockstep/test/kubevirtdouble"
	"github.com/lockstep-dev/lockstep/test/localcluster"
)

// The cluster: four nodes, the operator's node-lost grace short so that the suite is quick (a
// failover never waits for it: lockstepd decides).
const (
	clusterName   = "lockstep-fs"
	nodes         = 4
	nodeLostGrace = 10 * time.Second
)

// recordTermWait is how long the operator waits, after the last renewal of a pair's record it saw,
// before it starts the VM elsewhere (lockstepd's default term, which the chart keeps).
var recordTermWait = term.Term(term.Default).Wait()

var (
	k8s ctrlclient.Client
	// Installed as users install it: the chart (hack/local-cluster-values-fullstack.yaml: lockstepd,
	// COLO, the logging network), with the operator's webhooks answering.
	lc      = localcluster.New(clusterName, "FULLSTACK_KEEP", "FULL_STACK=1", "INSTALL=helm", "NODE_LOST_GRACE="+nodeLostGrace.String())
	up      bool
	figures = &localcluster.Figures{
		Title: fmt.Sprintf("Full-stack figures (node-lost grace %s; lockstepd's defaults)", nodeLostGrace),
		OnAdd: func(what string, d time.Duration) { AddReportEntry(what, d.Round(time.Millisecond).String()) },
	}
)

func TestFullStack(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "lockstep full-stack suite (local cluster, lockstepd, the KubeVirt hook, libvirt and QEMU)")
}

var _ = BeforeSuite(func() {
	By("bringing up the full-stack local cluster")
	up = true
	Expect(lc.Up(nodes)).To(Succeed())
	var err error
	k8s, err = lc.Client(0, 0)
	Expect(err).NotTo(HaveOccurred())
	By("waiting for lockstepd on every node: it publishes its logging address once it serves")
	Eventually(func(g Gomega) {
		for i := 1; i <= nodes; i++ {
			var n corev1.Node
			g.Expect(k8s.Get(context.Background(), types.NamespacedName{Name: nodeName(i)}, &n)).To(Succeed())
			g.Expect(n.Annotations).To(HaveKey(ftv1.AnnotationNodeLoggingAddress), "node %s", n.Name)
		}
	}, 3*time.Minute, time.Second).Should(Succeed())
})

var _ = AfterSuite(func() {
	if !up {
		return
	}
	GinkgoWriter.Print(figures.String())
	// Members run under their launchers' memory limits (KubeVirt's, test/virtlauncher): no
	// member's QEMU may have been killed at its limit (the double logs it as OOMKilled).
	if out, err := lc.Run("logs", "kubevirt-double"); err == nil {
		log, err := os.ReadFile(strings.TrimSpace(out))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(log)).NotTo(ContainSubstring("OOMKilled"), "a member's QEMU was killed at its launcher's memory limit")
	}
	msg, err := lc.End()
	GinkgoWriter.Println(msg)
	Expect(err).NotTo(HaveOccurred())
})

// When a spec fails, the logs of the operator, the double and each lockstepd are what a person
// needs first, and the members' serial consoles (what the guest printed: a boot that hung, a
// service that failed) and QEMU logs.
var _ = ReportAfterEach(func(r SpecReport) {
	if !r.Failed() || !up {
		return
	}
	var daemons []string
	for i := 1; i <= nodes; i++ {
		daemons = append(daemons, filepath.Join(lc.HostsDir(), nodeName(i)+"-lockstepd.log"))
	}
	for name, tail := range lc.Logs(40, daemons...) {
		AddReportEntry(name+" (tail)", tail)
	}
	// Each member's QEMU log too, whatever became of the member: why a QEMU exited (a lock on
	// a disk, an error of its own) is there and nowhere else.
	for pattern, lines := range map[string]string{
		filepath.Join("n*", "m", "*", "lv", "kubevirt-private", "*", "virt-serial0-log"): "40",
		filepath.Join("n*", "m", "*", "lv", "log", "qemu", "*.log"):                      "15",
	} {
		files, _ := filepath.Glob(filepath.Join(lc.HostsDir(), pattern))
		for _, f := range files {
			tail, _ := exec.Command("tail", "-n", lines, f).CombinedOutput()
			rel, _ := filepath.Rel(lc.HostsDir(), f)
			AddReportEntry(rel+" (tail)", string(tail))
		}
	}
})

func nodeName(i int) string { return fmt.Sprintf("node-%d", i) }

// clientNS is the client's namespace on the VM network.
func clientNS() string { return kubevirtdouble.ClientNS(clusterName) }

// cluster runs hack/local-cluster.sh against the full-stack cluster and returns its output.
func cluster(args ...string) string {
	out, err := lc.Run(args...)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return out
}

// kubectl runs the cluster's kubectl.
func kubectl(args ...string) string {
	out, err := lc.Kubectl(args...)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return out
}
