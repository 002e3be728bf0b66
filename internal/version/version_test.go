package version

import (
	"flag"
	"strings"
	"testing"
)

func TestStringIsTheStampedVersion(t *testing.T) {
	defer func(v string) { Version = v }(Version)
	Version = "v0.1.0"
	if got := String(); got != "v0.1.0" {
		t.Fatalf("String() = %q, want the stamped v0.1.0", got)
	}
	Version = "dev"
	if got := String(); !strings.HasPrefix(got, "dev") {
		t.Fatalf("String() of an unstamped build = %q, want dev...", got)
	}
}

func TestAddFlagDefinesVersion(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	f := AddFlag(fs, "x")
	if err := fs.Parse(nil); err != nil || *f.set {
		t.Fatalf("parse: %v, set %v", err, *f.set)
	}
	if fs.Lookup("version") == nil {
		t.Fatal("no --version")
	}
}
