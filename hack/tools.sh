#!/usr/bin/env bash
# Installs a pinned Go tool into ~/.cache/lockstep/tools/<name>@<version>/ and links it into bin/.
#
#   hack/tools.sh controller-gen|golangci-lint|golangci-kal|kustomize|helm|promtool|ginkgo|buf|protoc-gen-go|protoc-gen-go-grpc|kubeconform|kube-score ...
#
# Reruns are instant: a tool is built once per version.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}/tools"
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false

# name -> module path and version. ginkgo follows go.mod so that the CLI matches the library.
pkg_of() {
  case "$1" in
    controller-gen) echo "sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0" ;;
    golangci-lint)  echo "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.11.4" ;;
    kustomize)      echo "sigs.k8s.io/kustomize/kustomize/v5@v5.8.2" ;;
    helm)           echo "helm.sh/helm/v3/cmd/helm@v3.22.0" ;;
    promtool)       echo "github.com/prometheus/prometheus/cmd/promtool@v0.308.0" ;;
    # golangci-lint with the Kube API Linter built in (a module plugin), for make lint-api.
    golangci-kal)   echo "sigs.k8s.io/kube-api-linter@v0.0.0-20260716143926-092fe0c72997" ;;
    kwokctl)        echo "sigs.k8s.io/kwok/cmd/kwokctl@v0.8.0" ;;
    # The outside judges of make lint-manifests.
    kubeconform)    echo "github.com/yannh/kubeconform/cmd/kubeconform@v0.8.0" ;;
    kube-score)     echo "github.com/zegl/kube-score/cmd/kube-score@v1.20.0" ;;
    kwok)           echo "sigs.k8s.io/kwok/cmd/kwok@v0.8.0" ;;
    buf)            echo "github.com/bufbuild/buf/cmd/buf@v1.75.0" ;;
    protoc-gen-go)  echo "google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12" ;;
    protoc-gen-go-grpc) echo "google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2" ;;
    ginkgo)         echo "github.com/onsi/ginkgo/v2/ginkgo@$(cd "$ROOT" && go list -m -f '{{.Version}}' github.com/onsi/ginkgo/v2)" ;;
    *) echo "unknown tool $1" >&2; return 2 ;;
  esac
}

mkdir -p "$ROOT/bin"
for tool in "$@"; do
  pkg="$(pkg_of "$tool")"
  dir="$CACHE/$tool@${pkg##*@}"
  [ "$tool" = promtool ] && dir="$dir-nosd" # built without its service discovery (below)
  if [ ! -x "$dir/$tool" ]; then
    echo ">> installing $pkg into $dir" >&2
    mkdir -p "$dir"
    case "$tool" in
      promtool)
        # Prometheus's go.mod has exclude directives, which `go install pkg@version` refuses: build
        # it from a throwaway module that requires it (its own go.mod is copied, so that the
        # versions are the ones Prometheus pins).
        # Its service discovery plugins (AWS, Azure, GCE, OpenStack and a dozen more: most of
        # its build) are left out: the module is built from a copy whose plugins/plugins.go
        # imports none. `promtool check rules` and `promtool test rules`, all that lockstep runs,
        # use none (the directory says so: promtool@VERSION-nosd).
        mod="$dir/src"
        rm -rf "$mod" && mkdir -p "$mod"
        download="$(go mod download -json "${pkg%%/cmd/*}@${pkg##*@}")"
        gomod="$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' <<<"$download")"
        src="$(sed -n 's/.*"Dir": "\(.*\)".*/\1/p' <<<"$download")"
        [ -f "$src/plugins/plugins.go" ] || { echo "promtool: no plugins/plugins.go in $src" >&2; exit 1; }
        cp -r "$src" "$mod/prometheus" && chmod -R u+w "$mod/prometheus"
        printf '// Package plugins: no service discovery plugins (hack/tools.sh).\npackage plugins\n' >"$mod/prometheus/plugins/plugins.go"
        sed "s#^module .*#module lockstep.local/promtool#" "$gomod" >"$mod/go.mod"
        printf 'require %s %s\nreplace %s => ./prometheus\n' "${pkg%%/cmd/*}" "${pkg##*@}" "${pkg%%/cmd/*}" >>"$mod/go.mod"
        (cd "$mod" && GOFLAGS=-mod=mod go build -trimpath -o "$dir/$tool" "${pkg%@*}") ;;
      golangci-kal)
        # What `golangci-lint custom` makes, without the git clone it needs: golangci-lint's
        # commands, and the Kube API Linter registered as the module plugin "kubeapilinter".
        mod="$dir/src"
        mkdir -p "$mod"
        lint="$(pkg_of golangci-lint)"
        cat >"$mod/main.go" <<'GO'
// Command golangci-kal is golangci-lint with the Kube API Linter (module plugin kubeapilinter).
package main

import (
	"fmt"
	"os"

	"github.com/golangci/golangci-lint/v2/pkg/commands"
	"github.com/golangci/golangci-lint/v2/pkg/exitcodes"
	_ "sigs.k8s.io/kube-api-linter"
)

func main() {
	if err := commands.Execute(commands.BuildInfo{Version: "custom-kal", GoVersion: "go", Commit: "?", Date: ""}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(exitcodes.Failure)
	}
}
GO
        printf 'module lockstep.local/golangci-kal\n\ngo 1.26\n\nrequire (\n\t%s %s\n\t%s %s\n)\n' \
          "${lint%%/cmd/*}" "${lint##*@}" "${pkg%@*}" "${pkg##*@}" >"$mod/go.mod"
        (cd "$mod" && GOFLAGS=-mod=mod go mod tidy && go build -trimpath -o "$dir/$tool" .) ;;
      *) GOBIN="$dir" go install "$pkg" ;;
    esac
  fi
  ln -sfn "$dir/$tool" "$ROOT/bin/$tool"
done
