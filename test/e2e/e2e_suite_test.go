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
	"os"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockstep-dev/lockstep/test/localcluster"
)

// nodeLostGrace is the operator's --node-lost-grace here: short, so that the suite is quick.
const nodeLostGrace = "5s"

var (
	k8s      client.Client
	suiteCtx context.Context
	lc       *localcluster.Cluster
	timings  = &localcluster.Figures{
		Title: "Recovery times measured (node loss detected after kube-controller-manager's 8s grace, then --node-lost-grace=" + nodeLostGrace + ")",
		OnAdd: func(what string, d time.Duration) { AddReportEntry(what, d.Round(100*time.Millisecond).String()) },
	}
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "lockstep end-to-end suite (local cluster)")
}

var _ = BeforeSuite(func() {
	suiteCtx = context.Background()
	name := os.Getenv("E2E_CLUSTER_NAME")
	if name == "" {
		name = "lockstep-e2e"
	}
	// Installed as users install it: the chart, with the operator's webhooks answering.
	lc = localcluster.New(name, "E2E_KEEP", "INSTALL=helm", "NODE_LOST_GRACE="+nodeLostGrace)

	By("bringing up the local cluster with 6 nodes, the operator and the KubeVirt test double")
	Expect(lc.Up(6)).To(Succeed())
	var err error
	k8s, err = lc.Client(100, 200)
	Expect(err).NotTo(HaveOccurred())
	waitNodesReady(nodeNames(6)...)
})

var _ = AfterSuite(func() {
	if lc == nil {
		return
	}
	GinkgoWriter.Print(timings.String())
	msg, err := lc.End()
	GinkgoWriter.Println(msg)
	Expect(err).NotTo(HaveOccurred())
})

// When a spec fails, the operator's and the double's logs are what a person needs first.
var _ = ReportAfterEach(func(r SpecReport) {
	if !r.Failed() || lc == nil {
		return
	}
	for name, tail := range lc.Logs(60) {
		AddReportEntry(name+" (tail)", tail)
	}
})

// cluster runs hack/local-cluster.sh against the e2e cluster and returns its output.
func cluster(args ...string) string {
	out, err := lc.Run(args...)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return out
}
