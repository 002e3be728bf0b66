// Package version is lockstep's version, which the build stamps into every binary (and `make
// images` into the images' labels): a release's tag, or the commit for a build between releases.
package version

import (
	"flag"
	"fmt"
	"os"
	"runtime/debug"
)

// Version is set by the build: -ldflags "-X github.com/lockstep-dev/lockstep/internal/version.Version=v0.1.0"
// (the Makefile's VERSION). A plain `go build` leaves it "dev".
var Version = "dev"

// String is Version; for a "dev" build, with the commit the Go toolchain recorded when it built
// in a Git checkout ("dev (2ffa98b, modified)").
func String() string {
	if Version != "dev" {
		return Version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return Version
	}
	rev, modified := "", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	switch {
	case rev == "":
		return Version
	case modified:
		return fmt.Sprintf("%s (%.7s, modified)", Version, rev)
	default:
		return fmt.Sprintf("%s (%.7s)", Version, rev)
	}
}

// Flag is a binary's --version.
type Flag struct {
	program string
	set     *bool
}

// AddFlag defines --version on fs.
func AddFlag(fs *flag.FlagSet, program string) Flag {
	return Flag{program: program, set: fs.Bool("version", false, "Print the version and exit.")}
}

// ExitIfSet prints "<program> <version>" and exits when --version was given; call it once the
// flags are parsed.
func (f Flag) ExitIfSet() {
	if *f.set {
		fmt.Printf("%s %s\n", f.program, String())
		os.Exit(0)
	}
}
