// Command lockstepd is the node daemon of lockstep: for every FT member on its node it runs the
// FT log channel, the output commit gate, failure detection and go-live arbitration around the
// member's VM engine. Its engine is QEMU COLO (the default, and this build's only one): it
// attaches to each member's QEMU through the member's directory under --run-dir. The data-plane
// tests run test/vmdouble/cmd/lockstepd-vmdouble, the same daemon with a counter VM standing in
// for QEMU.
package main

import (
	"flag"
	"os"

	"github.com/lockstep-dev/lockstep/internal/lockstepd"
	"github.com/lockstep-dev/lockstep/internal/lockstepd/coloengine"
)

func main() {
	var colo coloengine.Options
	colo.BindFlags(flag.CommandLine)
	os.Exit(lockstepd.Main(map[string]lockstepd.EngineFactory{"colo": coloengine.Factory(colo)}))
}
