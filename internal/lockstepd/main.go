package lockstepd

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	virtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/scheme"
	"github.com/lockstep-dev/lockstep/internal/version"
)

// DefaultEngine is the engine --engine selects when it is not given: QEMU COLO.
const DefaultEngine = "colo"

// Main runs lockstepd with the given engines (by --engine name) and returns the exit code. The
// default engine is DefaultEngine when the build has it, else the build's only engine. Flags of
// the engines must be defined on flag.CommandLine before it is called.
func Main(engines map[string]EngineFactory) int {
	names := make([]string, 0, len(engines))
	for n := range engines {
		names = append(names, n)
	}
	sort.Strings(names)
	var cfg Config
	cfg.BindFlags(flag.CommandLine)
	if f := flag.CommandLine.Lookup("engine"); f != nil {
		def := DefaultEngine
		if _, ok := engines[def]; !ok && len(names) == 1 {
			def = names[0]
		}
		f.DefValue, f.Usage = def, fmt.Sprintf("VM engine, one of: %s.", strings.Join(names, ", "))
		_ = f.Value.Set(def)
	}
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	versionFlag := version.AddFlag(flag.CommandLine, "lockstepd")
	flag.Parse()
	versionFlag.ExitIfSet()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	setup := ctrl.Log.WithName("setup")
	setup.Info("lockstepd", "version", version.String())
	if err := FromEnv(flag.CommandLine); err != nil {
		setup.Error(err, "bad environment")
		return 2
	}
	newEngine, ok := engines[cfg.Engine]
	if !ok {
		fmt.Fprintf(os.Stderr, "lockstepd: --engine %q: this build knows the engines [%s]\n", cfg.Engine, strings.Join(names, ", "))
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "lockstepd: %v\n", err)
		return 2
	}

	members, _ := labels.NewRequirement(ftv1.LabelPair, selection.Exists, nil)
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme.New(),
		Metrics:                metricsserver.Options{BindAddress: cfg.MetricsAddress},
		HealthProbeBindAddress: cfg.HealthAddress,
		// Every FT member of the cluster (a primary needs its secondary's node), nothing else.
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&virtv1.VirtualMachineInstance{}: {Label: labels.NewSelector().Add(*members)},
			&corev1.Node{}:                   {},
		}},
		// Graceful shutdown: agents stop and the listener closes before the process exits.
		GracefulShutdownTimeout: new(cfg.Timeout * 10),
	})
	if err != nil {
		setup.Error(err, "creating the manager")
		return 1
	}
	records, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		setup.Error(err, "creating the records' client")
		return 1
	}
	ctx := ctrl.SetupSignalHandler()
	if cfg.CertRequest {
		certs := &CertRequester{Config: &cfg, Client: records, Log: ctrl.Log.WithName("certificate")}
		if err := certs.Ensure(ctx); err != nil {
			setup.Error(err, "obtaining the node's certificate")
			return 1
		}
		if err := mgr.Add(certs); err != nil {
			setup.Error(err, "adding the certificate's renewal")
			return 1
		}
	}
	d := &Daemon{Config: cfg, Client: mgr.GetClient(), Records: records, Node: &Node{NewEngine: newEngine}}
	if err := d.SetupWithManager(mgr); err != nil {
		setup.Error(err, "setting up lockstepd")
		return 1
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		setup.Error(err, "adding the health check")
		return 1
	}
	setup.Info("starting lockstepd", "node", cfg.NodeName, "engine", cfg.Engine, "advertise", cfg.AdvertiseAddress)
	if err := mgr.Start(ctx); err != nil {
		setup.Error(err, "lockstepd stopped")
		return 1
	}
	return 0
}
