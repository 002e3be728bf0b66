// Command kubevirt-double is a TEST DOUBLE of KubeVirt for the local cluster (hack/local-cluster.sh):
// it gives each VirtualMachineInstance a launcher-like pod for the real scheduler to place and
// mirrors the pod into the VMI status. It boots nothing. See test/kubevirtdouble.
package main

import (
	"flag"
	"os"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	virtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/lockstep-dev/lockstep/test/kubevirtdouble"
)

func main() {
	var image string
	flag.StringVar(&image, "launcher-image", "quay.io/kubevirt/virt-launcher:test-double", "Image named in launcher pods (never pulled: kwok runs nothing).")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("kubevirt-double")

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, virtv1.AddToScheme} {
		if err := add(scheme); err != nil {
			log.Error(err, "scheme")
			os.Exit(1)
		}
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		log.Error(err, "manager")
		os.Exit(1)
	}
	if err := (&kubevirtdouble.Launcher{Client: mgr.GetClient(), Image: image}).SetupWithManager(mgr); err != nil {
		log.Error(err, "controller")
		os.Exit(1)
	}
	log.Info("running: launcher pods for VMIs, pod state mirrored into VMI status")
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "manager stopped")
		os.Exit(1)
	}
}
