//go:build e2e

// Package e2e runs lockstep end to end on the local cluster of hack/local-cluster.sh: a real
// kube-apiserver, etcd, kube-controller-manager and kube-scheduler, kwok-simulated nodes, the
// operator as a process with its own RBAC, and the KubeVirt test double (test/kubevirtdouble), the
// only fake in the loop. Nodes die the way hosts do: their heartbeats stop.
//
//	make test-e2e                  # brings up the cluster "lockstep-e2e", runs, tears it down
//	E2E_KEEP=1 make test-e2e       # leaves it up afterwards
package e2e

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
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockstep-dev/lockstep/controllers"
)

// nodeLostGrace is the operator's --node-lost-grace here: short, so that the suite is quick.
const nodeLostGrace = "5s"

var (
	k8s      client.Client
	suiteCtx context.Context
	root     string
	script   string
	// clusterEnv selects the e2e cluster for hack/local-cluster.sh.
	clusterEnv []string
	timings    = &timingLog{}
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "lockstep end-to-end suite (local cluster)")
}

var _ = BeforeSuite(func() {
	suiteCtx = context.Background()
	_, file, _, _ := runtime.Caller(0)
	root = filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	script = filepath.Join(root, "hack", "local-cluster.sh")
	name := os.Getenv("E2E_CLUSTER_NAME")
	if name == "" {
		name = "lockstep-e2e"
	}
	clusterEnv = []string{"CLUSTER_NAME=" + name, "NODE_LOST_GRACE=" + nodeLostGrace}

	By("bringing up the local cluster with 6 nodes, the operator and the KubeVirt test double")
	cluster("down") // a leftover of an interrupted run must not leak into this one
	cluster("up", "6")
	cfg, err := clientcmd.BuildConfigFromFlags("", strings.TrimSpace(cluster("kubeconfig")))
	Expect(err).NotTo(HaveOccurred())
	cfg.QPS, cfg.Burst = 100, 200
	k8s, err = client.New(cfg, client.Options{Scheme: controllers.NewScheme()})
	Expect(err).NotTo(HaveOccurred())
	waitNodesReady(nodeNames(6)...)
})

var _ = AfterSuite(func() {
	timings.print()
	if script == "" {
		return
	}
	if os.Getenv("E2E_KEEP") != "" {
		GinkgoWriter.Printf("E2E_KEEP set: the cluster stays up; KUBECONFIG=%s", cluster("kubeconfig"))
		return
	}
	cluster("down")
})

// When a spec fails, the operator's and the double's logs are what a person needs first.
var _ = ReportAfterEach(func(r SpecReport) {
	if !r.Failed() || script == "" {
		return
	}
	for _, p := range []string{"operator", "kubevirt-double"} {
		out, _ := exec.Command("tail", "-n", "60", strings.TrimSpace(cluster("logs", p))).CombinedOutput()
		AddReportEntry(p+" log (tail)", string(out))
	}
})

// cluster runs hack/local-cluster.sh against the e2e cluster and returns its output.
func cluster(args ...string) string {
	cmd := exec.Command(script, args...)
	cmd.Env = append(os.Environ(), clusterEnv...)
	out, err := cmd.CombinedOutput()
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "hack/local-cluster.sh %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

// timingLog collects the durations the suite reports (not asserts): how long recovery took.
type timingLog struct {
	mu      sync.Mutex
	entries []string
}

func (t *timingLog) add(what string, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.entries = append(t.entries, fmt.Sprintf("%-70s %6.1fs", what, d.Seconds()))
	AddReportEntry(what, d.Round(100*time.Millisecond).String())
}

func (t *timingLog) print() {
	t.mu.Lock()
	defer t.mu.Unlock()
	sort.Strings(t.entries)
	fmt.Printf("\nRecovery times measured (node loss detected after kube-controller-manager's 8s grace, then --node-lost-grace=%s):\n", nodeLostGrace)
	for _, e := range t.entries {
		fmt.Println("  " + e)
	}
}
