// Command lockstep-kubevirt-hook makes the QEMU of each FT member VMI a COLO member that the
// node's lockstepd can attach to. It runs in the member's virt-launcher pod and serves
// KubeVirt's hook sidecar protocol (v1alpha3), its Plugins API domain hook (KubeVirt v1.9+), or
// both.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/lockstep-dev/lockstep/internal/kubevirthook"
	"github.com/lockstep-dev/lockstep/internal/version"
)

func main() {
	var h kubevirthook.Hook
	var sidecar, plugin string
	flag.StringVar(&sidecar, "sidecar-socket", "/var/run/kubevirt-hooks/lockstep.sock", "Socket of the hook sidecar protocol, in the directory virt-launcher scans (empty: do not serve it).")
	flag.StringVar(&plugin, "plugin-socket", "", "Socket of the Plugins API's domain hook, the one the Plugin resource names, e.g. /var/run/kubevirt-plugin/lockstep/hook.sock (empty: do not serve it).")
	flag.StringVar(&h.RunDir, "run-dir", "/var/run/lockstep", "The members' directories (<run-dir>/<vmi-uid>) as QEMU sees them; lockstepd's --run-dir on the node.")
	flag.StringVar(&h.Emulator, "emulator", kubevirthook.LockstepQEMU, "QEMU binary of the members, in place of the launcher's own: lockstep's QEMU, from the image that config/kubevirt mounts into members' launcher pods. Empty: the launcher's own (only for a launcher whose QEMU runs lockstep's COLO).")
	versionFlag := version.AddFlag(flag.CommandLine, "lockstep-kubevirt-hook")
	flag.Parse()
	versionFlag.ExitIfSet()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	fmt.Fprintf(os.Stderr, "lockstep-kubevirt-hook %s: serving sidecar %q plugin %q, run dir %s, members' emulator %q\n", version.String(), sidecar, plugin, h.RunDir, h.Emulator)
	if err := kubevirthook.Serve(ctx, &h, sidecar, plugin); err != nil {
		fmt.Fprintf(os.Stderr, "lockstep-kubevirt-hook: %v\n", err)
		os.Exit(1)
	}
}
