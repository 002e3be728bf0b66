// Command lockstepd is the node daemon of lockstep: for every FT member on its node it runs the
// FT log channel, the output commit gate, failure detection and go-live arbitration around the
// member's VM engine. The QEMU COLO engine is issue 5; until it lands this build has no engine,
// and the data-plane tests run test/vmdouble/cmd/lockstepd-vmdouble, the same daemon with a
// counter VM standing in for QEMU.
package main

import (
	"os"

	"github.com/lockstep-dev/lockstep/internal/lockstepd"
)

func main() {
	os.Exit(lockstepd.Main(map[string]lockstepd.NewEngine{}))
}
