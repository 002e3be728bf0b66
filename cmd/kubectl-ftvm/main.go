// Command kubectl-ftvm is lockstep's kubectl plugin (kubectl ftvm): the status of protected VMs,
// the console of the member that runs each, and vSphere FT's day-two operations
// (docs/operator.md, "kubectl ftvm").
package main

import (
	"os"

	"github.com/lockstep-dev/lockstep/internal/ftvmctl"
)

func main() {
	os.Exit(ftvmctl.Main(os.Args[1:], ftvmctl.Env{Out: os.Stdout, Err: os.Stderr}))
}
