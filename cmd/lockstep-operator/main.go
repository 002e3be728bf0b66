// Command lockstep-operator is the controller manager of lockstep: it runs the FaultTolerantVM
// reconciler.
package main

import (
	"crypto/tls"
	"flag"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/lockstep-dev/lockstep/controllers"
	"github.com/lockstep-dev/lockstep/internal/admission"
	"github.com/lockstep-dev/lockstep/internal/placement"
	"github.com/lockstep-dev/lockstep/internal/version"
)

func main() {
	var (
		metricsAddr, probeAddr  string
		pprofAddr               string
		leNamespace             string
		secureMetrics, enableLE bool
		cfg                     controllers.Config
		limits                  placement.Limits
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8443", "Address of the metrics endpoint; 0 disables it.")
	flag.BoolVar(&secureMetrics, "metrics-secure", true, "Serve metrics over HTTPS, authenticated and authorized by the API server.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address of the health and readiness probes.")
	flag.StringVar(&pprofAddr, "pprof-bind-address", "0", "Address of Go's pprof endpoints (/debug/pprof/), for profiling the operator; 0 disables them. Bind it to loopback: it has no authentication.")
	flag.BoolVar(&enableLE, "leader-elect", true, "Elect a leader, so that one replica places members at a time.")
	flag.StringVar(&leNamespace, "leader-election-namespace", "", "Namespace of the leader election Lease; empty: the pod's namespace (needed outside a cluster).")
	flag.IntVar(&limits.MaxMembers, "max-ft-vms-per-node", 4, "FT limit: FT VM members (primaries and secondaries) per node; a node's ft.lockstep.dev/max-ft-vms annotation overrides it.")
	flag.IntVar(&limits.MaxVCPUs, "max-ft-vcpus-per-node", 8, "FT limit: vCPUs of FT VM members per node; ft.lockstep.dev/max-ft-vcpus overrides it.")
	flag.IntVar(&limits.LogBandwidthMbps, "node-log-bandwidth-mbps", 1000, "Logging bandwidth budget of a node in Mbit/s (0: not budgeted); ft.lockstep.dev/log-bandwidth-mbps overrides it.")
	flag.IntVar(&cfg.DefaultLogBandwidthMbps, "default-vm-log-bandwidth-mbps", 100, "Logging bandwidth reserved for a VM without spec.expectedLoad, in Mbit/s.")
	flag.DurationVar(&cfg.NodeLostGrace, "node-lost-grace", 40*time.Second, "How long a node may be NotReady or unreachable before its members are lost.")
	flag.DurationVar(&cfg.RetryInterval, "retry-interval", 30*time.Second, "How often a FaultTolerantVM that waits for a node is retried (node and VMI events retry at once).")
	flag.IntVar(&cfg.MaxConcurrentReconciles, "max-concurrent-reconciles", 16, "Parallel reconciles of different FaultTolerantVMs (a reconcile mostly waits on the API server); placement itself is serialized.")
	flag.StringVar(&cfg.Member.PriorityClassName, "priority-class", "lockstep-ft", "Priority class of members whose template names none.")
	flag.BoolVar(&cfg.Member.DedicatedCPUPlacement, "dedicated-cpu-placement", false, "Pin each vCPU to a host CPU (needs the kubelet CPU manager).")
	flag.BoolVar(&cfg.Member.COLO.Enabled, "colo", false, "Make members COLO members for lockstepd's COLO engine: the overlays, the replicated disk named for the KubeVirt hook, a secondary started paused (docs/kubevirt.md).")
	flag.StringVar(&cfg.Member.COLO.HookSidecarImage, "kubevirt-hook-image", "", "With --colo: the image of lockstep-kubevirt-hook, run as each member's hook sidecar (KubeVirt's Sidecar feature gate); empty where the Plugins API brings the hook.")
	flag.StringVar(&cfg.Member.COLO.CPUModel, "colo-cpu-model", "", "With --colo: the CPU model of members whose template names none (both members must show the guest the same CPU; KubeVirt's default host-model does only on identical nodes).")
	flag.StringVar(&cfg.Member.COLO.RunDir, "members-run-dir", "/var/run/lockstep", "With --colo: the members' directories as QEMU sees them (lockstepd's --run-dir).")
	var (
		webhooks       bool
		webhookPort    int
		webhookCertDir string
	)
	flag.BoolVar(&webhooks, "webhooks", true, "Serve the admission webhooks (config/webhook); every replica serves them, leader or not.")
	flag.IntVar(&webhookPort, "webhook-port", 9443, "Port of the admission webhooks.")
	flag.StringVar(&webhookCertDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs", "Directory of the webhooks' tls.crt and tls.key (cert-manager's Secret, mounted); reloaded when they change.")
	// client-go's default of 20 requests a second (burst 30) would let a thousand FaultTolerantVMs
	// of about seven requests each start in six minutes; API Priority and Fairness protects the
	// API server from a busier client.
	var apiQPS float64
	var apiBurst int
	flag.Float64Var(&apiQPS, "kube-api-qps", 100, "Requests a second the operator may make of the API server.")
	flag.IntVar(&apiBurst, "kube-api-burst", 200, "Requests the operator may make of the API server in a burst above --kube-api-qps.")
	var lockstepdSA, lockstepdCA string
	flag.StringVar(&cfg.LockstepdNamespace, "lockstepd-namespace", "", "Where lockstepd runs and renews its node leases (default: the namespace of --lockstepd-service-account, else lockstep-system).")
	flag.StringVar(&lockstepdSA, "lockstepd-service-account", "lockstep-system/lockstepd", "lockstepd's ServiceAccount (namespace/name): the only requester of lockstepd certificates the operator signs; empty: do not run the signer.")
	flag.StringVar(&lockstepdCA, "lockstepd-ca", "lockstep-system/lockstepd-ca", "Secret (namespace/name) of the lockstepd CA, made when missing; its certificate is published in the ConfigMap of the same name.")
	flag.DurationVar(&cfg.Signer.MaxLifetime, "lockstepd-certificate-max-lifetime", 30*24*time.Hour, "Longest lifetime of a lockstepd certificate.")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	versionFlag := version.AddFlag(flag.CommandLine, "lockstep-operator")
	flag.Parse()
	versionFlag.ExitIfSet()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	setupLog := ctrl.Log.WithName("setup")
	setupLog.Info("lockstep-operator", "version", version.String())
	// The Go runtime does not know the container's memory limit: it lets the heap grow to twice
	// what is live before it collects, and the kernel kills a container that reaches its limit.
	// A soft limit of 90 % of the cgroup's makes the runtime collect harder near it instead
	// (docs/operator.md, "Flags"). GOMEMLIMIT, when set, wins; with no cgroup limit nothing
	// changes.
	if _, err := memlimit.Set(memlimit.WithLogger(slog.New(logr.ToSlogHandler(setupLog)))); err != nil {
		setupLog.Error(err, "reading the container's memory limit; going on without a soft limit")
	}
	if lockstepdSA != "" {
		sa, ok := namespacedName(lockstepdSA)
		ca, ok2 := namespacedName(lockstepdCA)
		if !ok || !ok2 {
			setupLog.Error(nil, "--lockstepd-service-account and --lockstepd-ca are namespace/name", "service-account", lockstepdSA, "ca", lockstepdCA)
			os.Exit(2)
		}
		cfg.Signer.ServiceAccount = "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
		if cfg.LockstepdNamespace == "" {
			cfg.LockstepdNamespace = sa.Namespace
		}
		cfg.Signer.CA, cfg.Signer.CALifetime = ca, 10*365*24*time.Hour
	}
	if cfg.LockstepdNamespace == "" {
		cfg.LockstepdNamespace = "lockstep-system"
	}

	metricsOpts := metricsserver.Options{
		BindAddress:   metricsAddr,
		SecureServing: secureMetrics,
		// HTTP/2 is off: it exposes the server to the HTTP/2 Stream Cancellation and Rapid Reset CVEs.
		TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }},
	}
	if secureMetrics {
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	webhookServer := webhook.NewServer(webhook.Options{
		Port:    webhookPort,
		CertDir: webhookCertDir,
		TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }},
	})
	// Beside the request counts registered by default: how long requests take, and how long
	// they wait for --kube-api-qps, so that an administrator sees a throttled operator.
	ctrlmetrics.RegisterRESTClientMetrics(ctrlmetrics.MetricRequestLatency, ctrlmetrics.MetricRateLimiterLatency)
	restConfig := ctrl.GetConfigOrDie()
	restConfig.QPS, restConfig.Burst = float32(apiQPS), apiBurst
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                  controllers.NewScheme(),
		Metrics:                 metricsOpts,
		WebhookServer:           webhookServer,
		HealthProbeBindAddress:  probeAddr,
		PprofBindAddress:        pprofAddr,
		LeaderElection:          enableLE,
		LeaderElectionID:        "lockstep-operator.ft.lockstep.dev",
		LeaderElectionNamespace: leNamespace,
		// A replica that stops cleanly hands over at once; the process exits right after.
		LeaderElectionReleaseOnCancel: true,
		Cache:                         controllers.CacheOptions(),
	})
	if err != nil {
		setupLog.Error(err, "creating the manager")
		os.Exit(1)
	}
	ctx := ctrl.SetupSignalHandler()
	if err := controllers.Setup(ctx, mgr, cfg, limits); err != nil {
		setupLog.Error(err, "setting up the controllers")
		os.Exit(1)
	}
	ready := healthz.Ping
	if webhooks {
		if err := admission.Setup(mgr, admission.Options{Limits: limits, DefaultLogBandwidthMbps: cfg.DefaultLogBandwidthMbps, COLO: cfg.Member.COLO.Enabled}); err != nil {
			setupLog.Error(err, "setting up the webhooks")
			os.Exit(1)
		}
		// Ready once the webhook server serves, so that its Service sends requests only here.
		ready = webhookServer.StartedChecker()
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		setupLog.Error(err, "adding the health check")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", ready); err != nil {
		setupLog.Error(err, "adding the readiness check")
		os.Exit(1)
	}
	setupLog.Info("starting", "limits", limits, "nodeLostGrace", cfg.NodeLostGrace)
	if err := mgr.Start(ctx); err != nil {
		setupLog.Error(err, "running the manager")
		os.Exit(1)
	}
}

// namespacedName reads "namespace/name".
func namespacedName(s string) (types.NamespacedName, bool) {
	ns, name, ok := strings.Cut(s, "/")
	return types.NamespacedName{Namespace: ns, Name: name}, ok && ns != "" && name != ""
}
