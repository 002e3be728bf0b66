// Command kubevirt-double is a TEST DOUBLE of KubeVirt for the local cluster (hack/local-cluster.sh):
// it gives each VirtualMachineInstance a launcher-like pod for the real scheduler to place and
// mirrors the pod into the VMI status. With --hosts (the full stack) it also plays the nodes'
// machines: a network namespace per node with lockstepd running as its DaemonSet would, and each
// member VMI booted on its node's host through lockstep's KubeVirt hook and a libvirt daemon of its
// own, its phase following its domain. See test/kubevirtdouble.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
	virtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/lockstep-dev/lockstep/test/imagevolume"
	"github.com/lockstep-dev/lockstep/test/kubevirtdouble"
)

func main() {
	var (
		image                                            string
		hosts                                            bool
		cluster, state, storage                          string
		lockstepd, lockstepdSkewClock, hook, qemu, guest string
		images, kubevirtSA                               string
	)
	flag.StringVar(&image, "launcher-image", "quay.io/kubevirt/virt-launcher:test-double", "Image named in launcher pods (never pulled: kwok runs nothing).")
	flag.BoolVar(&hosts, "hosts", false, "Play the nodes' machines too: a network namespace per node running lockstepd, and member VMIs booted there (needs root).")
	flag.StringVar(&cluster, "cluster", "lockstep", "With --hosts: the cluster's name, which prefixes the namespaces' names (<cluster>_<node>, <cluster>_sw, <cluster>_client).")
	flag.StringVar(&state, "hosts-dir", "/run/lockstep-hosts", "With --hosts: the hosts' directories (short: Unix socket paths end at 107 bytes).")
	flag.StringVar(&storage, "storage-dir", "", "With --hosts: the claims' disk images (default <hosts-dir>/storage).")
	flag.StringVar(&lockstepd, "lockstepd", "bin/lockstepd", "With --hosts: the lockstepd binary.")
	flag.StringVar(&lockstepdSkewClock, "lockstepd-skew-clock", "", "With --hosts: lockstepd built with hack/skewclock.sh, which hosts whose clock is off run (hack/local-cluster.sh skew-clock).")
	flag.StringVar(&hook, "kubevirt-hook", "bin/lockstep-kubevirt-hook", "With --hosts: the hook binary.")
	flag.StringVar(&qemu, "qemu", "", "With --hosts: hack/qemu.sh's directory, for its OVMF (which KubeVirt's launcher image carries; members' QEMU comes from their pods' image volume).")
	flag.StringVar(&images, "images", "", "With --hosts: OCI archives, comma-separated, that serve the images launcher pods mount as image volumes (bin/images/lockstep-qemu.oci.tar: lockstep's QEMU).")
	flag.StringVar(&kubevirtSA, "kubevirt-service-account", "", "Write VMIs as this ServiceAccount of KubeVirt's, NAMESPACE:NAME (kubevirt:kubevirt-controller where virt-api runs: it lets only KubeVirt's ServiceAccounts change a VMI's status).")
	flag.StringVar(&guest, "guest", "", "With --hosts: hack/debian-guest.sh's directory (its disk.img is what a VMI's first claim of the user's is imported from).")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("kubevirt-double")
	fail := func(err error, what string) {
		log.Error(err, what)
		os.Exit(1)
	}

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, virtv1.AddToScheme, appsv1.AddToScheme, coordinationv1.AddToScheme} {
		if err := add(scheme); err != nil {
			fail(err, "scheme")
		}
	}
	cfg := ctrl.GetConfigOrDie()
	// virt-controller's defaults: one limiter of 200 requests a second (burst 400) for all its
	// clients (client-go's default would give each API group 20), so that the double is no
	// slower to start launchers than what it stands in for.
	cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(200, 400)
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		fail(err, "manager")
	}
	launcher := &kubevirtdouble.Launcher{Client: mgr.GetClient(), Image: image}
	if kubevirtSA != "" {
		// The double stands for virt-controller and virt-handler: it writes VMIs as KubeVirt's
		// ServiceAccount, which virt-api lets change a VMI's status (its own credentials may
		// impersonate: the local cluster's admin).
		ns, name, ok := strings.Cut(kubevirtSA, ":")
		if !ok {
			fail(fmt.Errorf("--kubevirt-service-account %q is not NAMESPACE:NAME", kubevirtSA), "flags")
		}
		as := rest.CopyConfig(cfg)
		as.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + name,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
		if launcher.VMIWriter, err = client.New(as, client.Options{Scheme: scheme}); err != nil {
			fail(err, "client")
		}
	}
	ctx := ctrl.SetupSignalHandler()
	if hosts {
		if storage == "" {
			storage = state + "/storage"
		}
		h := &kubevirtdouble.Hosts{Client: mgr.GetClient(), Clientset: kubernetes.NewForConfigOrDie(cfg), Config: cfg,
			Cluster: cluster, StateDir: state, Lockstepd: lockstepd, LockstepdSkewClock: lockstepdSkewClock, Log: log.WithName("hosts"),
			DaemonSet: types.NamespacedName{Namespace: "lockstep-system", Name: "lockstepd"}}
		if err := h.Setup(); err != nil {
			fail(err, "hosts")
		}
		// The hosts go with the double: when it stops, and on a restart (Setup removes what an
		// earlier run left).
		defer func() { _ = h.Teardown() }()
		if err := h.SetupWithManager(mgr); err != nil {
			fail(err, "hosts controller")
		}
		launcher.Domains = &kubevirtdouble.Domains{Hosts: h, QEMU: qemu, Guest: guest, Hook: hook, Storage: storage, Log: log.WithName("domains")}
		if archives := strings.FieldsFunc(images, func(r rune) bool { return r == ',' }); len(archives) > 0 {
			launcher.Domains.Images = &imagevolume.Registry{Archives: archives, Dir: filepath.Join(state, "images")}
		}
		claims := &kubevirtdouble.Claims{Client: mgr.GetClient(), Storage: storage, Log: log.WithName("claims")}
		if err := claims.SetupWithManager(mgr); err != nil {
			fail(err, "claims controller")
		}
	}
	if err := launcher.SetupWithManager(mgr); err != nil {
		fail(err, "controller")
	}
	log.Info("running: launcher pods for VMIs, pod state mirrored into VMI status", "hosts", hosts)
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "manager stopped")
	}
}
