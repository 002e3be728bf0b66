package controllers_test

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/lockstep-dev/lockstep/controllers"
	"github.com/lockstep-dev/lockstep/internal/admission"
	"github.com/lockstep-dev/lockstep/internal/member"
	"github.com/lockstep-dev/lockstep/internal/placement"
	"github.com/lockstep-dev/lockstep/test/kubevirtdouble"
)

// The envtest suite: a real kube-apiserver and etcd with lockstep's CRD and the KubeVirt, CDI
// (DataVolume), Multus, cert-manager and Prometheus operator CRDs installed. The operator runs in
// this process against it; kubevirtdouble.NodeRunner stands in for KubeVirt's node agents and
// kubevirtdouble.VMController for its VirtualMachine controller.

const (
	testNodeLostGrace = 2 * time.Second
	testRetry         = 2 * time.Second
)

var (
	testEnv   *envtest.Environment
	cfg       *rest.Config
	k8s       client.Client
	suiteCtx  context.Context
	stopSuite context.CancelFunc
	operator  *operatorProcess
)

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Controllers (envtest)")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	suiteCtx, stopSuite = context.WithCancel(context.Background())

	root := filepath.Join("..")
	testEnv = &envtest.Environment{
		CRDDirectoryPaths: []string{
			filepath.Join(root, "config", "crd", "bases"),
			filepath.Join(root, "bin", "test-crds", "kubevirt"),
			filepath.Join(root, "bin", "test-crds", "cdi"),
			filepath.Join(root, "bin", "test-crds", "multus"),
			filepath.Join(root, "bin", "test-crds", "cert-manager"),
			filepath.Join(root, "bin", "test-crds", "monitoring"),
		},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: filepath.Join(root, "bin", "k8s"),
		// The generated webhook configurations, pointed at this process's webhook server.
		WebhookInstallOptions: envtest.WebhookInstallOptions{Paths: []string{filepath.Join(root, "config", "webhook", "manifests.yaml")}},
	}
	if os.Getenv("KUBEBUILDER_ASSETS") != "" {
		testEnv.BinaryAssetsDirectory = ""
	}
	var err error
	cfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred(), "start envtest: run `make test` (it builds kube-apiserver and etcd into bin/k8s)")

	k8s, err = client.New(cfg, client.Options{Scheme: controllers.NewScheme()})
	Expect(err).NotTo(HaveOccurred())

	// The KubeVirt test double runs in its own manager, so that restarting the operator leaves it.
	double, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:     controllers.NewScheme(),
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	Expect((&kubevirtdouble.NodeRunner{Client: double.GetClient()}).SetupWithManager(double)).To(Succeed())
	Expect((&kubevirtdouble.VMController{Client: double.GetClient()}).SetupWithManager(double)).To(Succeed())
	Expect((&kubevirtdouble.LauncherPods{Client: double.GetClient()}).SetupWithManager(double)).To(Succeed())
	go func() {
		defer GinkgoRecover()
		Expect(double.Start(suiteCtx)).To(Succeed())
	}()

	// The adopted VirtualMachines' admission policy, as config/default and the chart install it.
	for _, u := range readObjects(filepath.Join(root, "config", "adoption", "adopted-vm-policy.yaml")) {
		Expect(k8s.Create(ctx(), u)).To(Succeed(), "%s %s", u.GetKind(), u.GetName())
	}

	startWebhooks()
	operator = startOperator()
})

// startWebhooks serves the admission webhooks as every operator replica does (admission.Setup),
// from a manager of their own: the specs that stop and restart the operator's controllers do not
// take admission down with them, as a second replica would keep it up in a cluster.
func startWebhooks() {
	wo := &testEnv.WebhookInstallOptions
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:        controllers.NewScheme(),
		Metrics:       metricsserver.Options{BindAddress: "0"},
		Cache:         controllers.CacheOptions(),
		WebhookServer: webhook.NewServer(webhook.Options{Host: wo.LocalServingHost, Port: wo.LocalServingPort, CertDir: wo.LocalServingCertDir}),
	})
	Expect(err).NotTo(HaveOccurred())
	Expect(admission.Setup(mgr, admission.Options{Limits: testLimits, DefaultLogBandwidthMbps: 100})).To(Succeed())
	go func() {
		defer GinkgoRecover()
		Expect(mgr.Start(suiteCtx)).To(Succeed())
	}()
	// Serving once a TLS handshake with it succeeds.
	addr := net.JoinHostPort(wo.LocalServingHost, strconv.Itoa(wo.LocalServingPort))
	Eventually(func() error {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only checks that it serves
		if err != nil {
			return err
		}
		return conn.Close()
	}, 30*time.Second, 100*time.Millisecond).Should(Succeed())
}

// Every spec leaves the cluster as it found it: what one spec leaves behind must never decide
// another's outcome (a leftover member once held FT slots on a node of the next spec).
var _ = AfterEach(func() { expectNothingLeft() })

var _ = AfterSuite(func() {
	if operator != nil {
		operator.stop()
	}
	if stopSuite != nil {
		stopSuite()
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})

// operatorProcess is the operator's manager, as `lockstep-operator` runs it.
type operatorProcess struct {
	cancel context.CancelFunc
	done   chan struct{}
}

var testLimits = placement.Limits{MaxMembers: 4, MaxVCPUs: 8, LogBandwidthMbps: 1000}

func startOperator() *operatorProcess { return startOperatorWith(nil) }

// startOperatorWith starts the operator with newClient making its client (nil: the default), so
// that a test can intercept its writes; configure, when given, changes its configuration (as
// its flags would).
func startOperatorWith(newClient client.NewClientFunc, configure ...func(*controllers.Config)) *operatorProcess {
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:     controllers.NewScheme(),
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Cache:      controllers.CacheOptions(),
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
		NewClient:  newClient,
	})
	Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(suiteCtx)
	operatorConfig := controllers.Config{
		Member:                  member.Options{PriorityClassName: "lockstep-ft"},
		NodeLostGrace:           testNodeLostGrace,
		RetryInterval:           testRetry,
		DefaultLogBandwidthMbps: 100,
		MaxConcurrentReconciles: 4,
	}
	for _, f := range configure {
		f(&operatorConfig)
	}
	Expect(controllers.Setup(ctx, mgr, operatorConfig, testLimits)).To(Succeed())
	p := &operatorProcess{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer GinkgoRecover()
		defer close(p.done)
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
	return p
}

func (p *operatorProcess) stop() {
	p.cancel()
	Eventually(p.done, 30*time.Second).Should(BeClosed())
}
