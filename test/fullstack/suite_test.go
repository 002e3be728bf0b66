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
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/controllers"
	"github.com/lockstep-dev/lockstep/test/kubevirtdouble"
)

// The cluster: four nodes, the operator's node-lost grace short so that the suite is quick (a
// failover never waits for it: lockstepd decides).
const (
	clusterName   = "lockstep-fs"
	nodes         = 4
	nodeLostGrace = 10 * time.Second
)

var (
	k8s        ctrlclient.Client
	root       string
	script     string
	clusterEnv []string
	figures    = &figureLog{}
)

func TestFullStack(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "lockstep full-stack suite (local cluster, lockstepd, the KubeVirt hook, libvirt and QEMU)")
}

var _ = BeforeSuite(func() {
	_, file, _, _ := runtime.Caller(0)
	root = filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	script = filepath.Join(root, "hack", "local-cluster.sh")
	clusterEnv = []string{"CLUSTER_NAME=" + clusterName, "FULL_STACK=1", "NODE_LOST_GRACE=" + nodeLostGrace.String()}

	By("bringing up the full-stack local cluster")
	cluster("down")
	cluster("up", fmt.Sprint(nodes))
	cfg, err := clientcmd.BuildConfigFromFlags("", strings.TrimSpace(cluster("kubeconfig")))
	Expect(err).NotTo(HaveOccurred())
	k8s, err = ctrlclient.New(cfg, ctrlclient.Options{Scheme: controllers.NewScheme()})
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
	figures.print()
	if script == "" {
		return
	}
	if os.Getenv("FULLSTACK_KEEP") != "" {
		fmt.Printf("FULLSTACK_KEEP set: the cluster stays up; KUBECONFIG=%s", cluster("kubeconfig"))
		return
	}
	cluster("down")
})

// When a spec fails, the logs of the operator, the double and each lockstepd are what a person
// needs first.
var _ = ReportAfterEach(func(r SpecReport) {
	if !r.Failed() || script == "" {
		return
	}
	logs := []string{strings.TrimSpace(cluster("logs", "operator")), strings.TrimSpace(cluster("logs", "kubevirt-double"))}
	for i := 1; i <= nodes; i++ {
		logs = append(logs, filepath.Join(hostsDir(), nodeName(i)+"-lockstepd.log"))
	}
	for _, p := range logs {
		out, _ := exec.Command("tail", "-n", "40", p).CombinedOutput()
		AddReportEntry(filepath.Base(p)+" (tail)", string(out))
	}
})

func nodeName(i int) string { return fmt.Sprintf("node-%d", i) }

// hostsDir is the KubeVirt double's hosts directory for the cluster (hack/local-cluster.sh).
func hostsDir() string { return "/run/lockstep-hosts/" + clusterName }

// clientNS is the client's namespace on the VM network.
func clientNS() string { return kubevirtdouble.ClientNS(clusterName) }

// cluster runs hack/local-cluster.sh against the full-stack cluster and returns its output.
func cluster(args ...string) string {
	cmd := exec.Command(script, args...)
	cmd.Env = append(os.Environ(), clusterEnv...)
	out, err := cmd.CombinedOutput()
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "hack/local-cluster.sh %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

// kubectl runs the cluster's kubectl.
func kubectl(args ...string) string {
	cmd := exec.Command(filepath.Join(root, "bin", "k8s", "kubectl"), append([]string{"--kubeconfig", strings.TrimSpace(cluster("kubeconfig"))}, args...)...)
	out, err := cmd.CombinedOutput()
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "kubectl %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

// figureLog collects what the suite measures (reported, not asserted).
type figureLog struct {
	mu      sync.Mutex
	entries []string
}

func (f *figureLog) add(what string, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.entries = append(f.entries, fmt.Sprintf("%-72s %8s", what, d.Round(time.Millisecond)))
	AddReportEntry(what, d.Round(time.Millisecond).String())
}

func (f *figureLog) print() {
	f.mu.Lock()
	defer f.mu.Unlock()
	sort.Strings(f.entries)
	fmt.Printf("\nFull-stack figures (node-lost grace %s; lockstepd's defaults):\n", nodeLostGrace)
	for _, e := range f.entries {
		fmt.Println("  " + e)
	}
}
