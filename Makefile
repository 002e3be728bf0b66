# lockstep: make KubeVirt VMs fault tolerant.
#
# Everything a target needs is installed by hack/ scripts, pinned and cached under
# ~/.cache/lockstep, so a cold machine needs only Go and the module proxy.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
export GOTOOLCHAIN := local
export GOFLAGS := -buildvcs=false

BIN := $(CURDIR)/bin
CONTROLLER_GEN := $(BIN)/controller-gen
# golangci-lint is the build of it with the Kube API Linter registered (hack/tools.sh
# golangci-kal): the same pinned golangci-lint, built once rather than twice on a cold machine.
GOLANGCI_LINT := $(BIN)/golangci-kal
GINKGO := $(BIN)/ginkgo
BUF := $(BIN)/buf
PROTOC_GEN_GO := $(BIN)/protoc-gen-go
PROTOC_GEN_GO_GRPC := $(BIN)/protoc-gen-go-grpc
KUSTOMIZE := $(BIN)/kustomize
HELM := $(BIN)/helm
PROMTOOL := $(BIN)/promtool
# The envtest suite's processes: its specs mostly wait on the API server (a serial run keeps a
# third of one core busy), so three take a third of the time on two cores.
ENVTEST_PROCS ?= 3
WORKLOADS_OUT ?= $(CURDIR)/bin/bench/workloads.json
WORKLOADS_PNG ?= $(CURDIR)/bin/bench/workloads.png
IMG ?= ghcr.io/lockstep-dev/lockstep-operator:dev
# VERSION is stamped into the binaries (internal/version) and the images' labels: the release tag
# at a tag, else the commit (docs/versioning.md).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
VERSION_LDFLAGS := -X github.com/lockstep-dev/lockstep/internal/version.Version=$(VERSION)
# QEMU_IMG is lockstep's QEMU, which members' launchers mount (config/kubevirt).
QEMU_IMG ?= ghcr.io/lockstep-dev/lockstep-qemu:dev

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show the targets.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  %-16s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: $(CONTROLLER_GEN) $(KUSTOMIZE) ## Generate the CRD and RBAC manifests from the Go types and markers.
	$(CONTROLLER_GEN) rbac:roleName=lockstep-operator crd:allowDangerousTypes=true webhook \
		paths="./api/..." paths="./controllers/..." paths="./internal/admission/..." \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac \
		output:webhook:artifacts:config=config/webhook
	go run ./hack/crdtrim config/crd/bases/ft.lockstep.dev_faulttolerantvms.yaml
	$(CONTROLLER_GEN) rbac:roleName=lockstepd paths="./internal/lockstepd/..." output:rbac:artifacts:config=config/lockstepd/rbac
	KUSTOMIZE=$(KUSTOMIZE) hack/chart-files.sh
	go run ./hack/apidocs config/crd/bases/ft.lockstep.dev_faulttolerantvms.yaml config/crd/bases/ft.lockstep.dev_faulttolerantvmoperations.yaml > docs/api.md

.PHONY: generate
generate: $(CONTROLLER_GEN) $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC) ## Generate the deepcopy functions and the KubeVirt hook protocols' Go code.
	$(CONTROLLER_GEN) object paths="./api/..."
	$(BUF) generate

.PHONY: fmt
fmt: ## go fmt.
	go fmt ./...

.PHONY: vet
vet: ## go vet (the e2e, VM and chaos suites too). make test leaves it to golangci-lint's govet, which runs with the same tags.
	go vet -tags e2e,vmtier,chaos,fullstack,helm ./...

.PHONY: lint
lint: $(GOLANGCI_KAL) lint-api lint-manifests ## golangci-lint (config in .golangci.yml), its depguard rules proven, the Kube API Linter over api/, and the outside judges over the manifests.
	$(GOLANGCI_LINT) run ./...
	GOLANGCI_LINT=$(GOLANGCI_LINT) hack/lint-rules.sh

GOLANGCI_KAL := $(BIN)/golangci-kal
$(GOLANGCI_KAL):
	hack/tools.sh golangci-kal

.PHONY: lint-api
lint-api: $(GOLANGCI_KAL) ## The Kube API Linter over api/ (.golangci-kal.yml: clean, each exception with its reason).
	$(GOLANGCI_KAL) run -c .golangci-kal.yml ./api/...

.PHONY: lint-manifests
lint-manifests: envtest-assets test-crds ## kubeconform -strict (schemas generated from the pinned kube-apiserver and the CRDs) and kube-score (hack/kube-score-exceptions: each skipped check with its reason) over the chart, default and non-default, and config/ (hack/judges.sh).
	hack/judges.sh

.PHONY: verify
verify: manifests generate ## Fail if generated files (CRDs, RBAC, deepcopy, the API reference) or go.mod are stale, or code is unformatted.
	go mod tidy
	@if [ -n "$$(gofmt -l $$(git ls-files '*.go'))" ]; then echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; fi
	@if [ -n "$$(git status --porcelain -- api config charts docs/api.md internal/kubevirthook/api go.mod go.sum)" ]; then \
		echo "generated files are stale; run 'make manifests generate' and 'go mod tidy', then commit:"; \
		git status --porcelain -- api config charts docs/api.md internal/kubevirthook/api go.mod go.sum; git --no-pager diff --stat -- api config charts docs/api.md internal/kubevirthook/api go.mod go.sum; exit 1; fi

##@ Test

.PHONY: test
test: verify lint test-unit test-rules test-images test-envtest test-install test-kubevirt test-dataplane test-vm test-libvirt test-e2e test-scale test-helm test-fullstack test-chaos ## Everything CI runs.

.PHONY: test-unit
test-unit: ## Unit, property and fuzz-seed tests: placement, health, member, validation, ftlog, gate, channel, the lockstepd agent; the test doubles and the fault proxy.
	hack/gotest.sh unit -race -count=1 $$(go list ./internal/... | grep -v /internal/arbiter) ./api/... ./test/kubevirtdouble/... ./test/virtlauncher/... ./hack/debian-guest/... ./hack/benchreport/... ./test/workloads/... ./test/faultproxy/... ./test/chaos/... ./test/counter/... ./test/scale/... ./test/apps/... ./test/imagevolume/...

.PHONY: test-envtest
test-envtest: envtest-assets test-crds installer $(GINKGO) ## The controllers, and the Lease arbiter, against a real kube-apiserver and etcd; the controllers' specs in ENVTEST_PROCS (default 3) processes, each with its own API server.
	hack/gotest.sh arbiter -race -count=1 ./internal/arbiter/...
	hack/gotest.sh envtest --ginkgo -p --procs=$(ENVTEST_PROCS) -v --timeout=20m ./controllers

.PHONY: test-install
test-install: envtest-assets test-crds $(HELM) $(KUSTOMIZE) ## The install paths against a real API server: helm lint, the chart (default and non-default values) and config/default and config/prometheus by server-side dry run, and the chart and config/default installing the same.
	hack/gotest.sh install -count=1 -timeout 10m -v ./test/install/...

.PHONY: test-rules
test-rules: $(PROMTOOL) ## The alert rules (config/prometheus/rules.yaml) checked and unit-tested with Prometheus's promtool.
	go run ./hack/promrules config/prometheus/rules.yaml > $(BIN)/lockstep.rules.yaml
	$(PROMTOOL) check rules $(BIN)/lockstep.rules.yaml
	$(PROMTOOL) test rules config/prometheus/rules_test.yaml

.PHONY: test-dataplane
test-dataplane: envtest-assets test-crds ## lockstepd processes in network namespaces with Toxiproxy in the log path, kill -9, partitions, the API server cut (needs root).
	hack/gotest.sh dataplane -count=1 -timeout 15m -v ./test/dataplane/...

.PHONY: vm-assets
vm-assets: ## The VM tier's QEMU (Debian's source with lockstep's COLO patches; about 4 minutes cold) and test guest, cached under ~/.cache/lockstep.
	hack/qemu.sh >/dev/null
	hack/guest.sh >/dev/null

.PHONY: debian-guest-assets
debian-guest-assets: ## The real guest (hack/debian-guest.sh: Debian 12 by debootstrap on a disk that boots by itself; 82 s cold), and its variant with make bench-workloads' programs, made from the plain guest's tree (32 s), and the host tools its tiers use, cached under ~/.cache/lockstep.
	hack/debian-guest.sh >/dev/null
	DEBIAN_GUEST_VARIANT=workloads hack/debian-guest.sh >/dev/null

.PHONY: test-vm
test-vm: vm-assets envtest-assets test-crds ## The VM tier: COLO pairs of real QEMU, launched as a launcher would, with lockstepd's production wiring (and its binary) attached, in network namespaces: failover while a checkpoint's RAM goes ahead, a secondary catching up from an earlier secondary's copies, what colo-compare holds, the packets it releases reaching the client in order, a secondary started before its primary protects still reading the mirrored packets, a primary whose QEMU is stuck failed over, a request that reached the secondary while its VM was stopped or loaded a checkpoint, or on a connection whose handshake a checkpoint cut, a packet the primary's NIC could not take at a checkpoint kept for it and mirrored again, the primary's disk writes completing before the secondary has them, lockstepd restarts and finding its members (the plain failovers run in test-libvirt).
	hack/gotest.sh vm -tags vmtier -count=1 -timeout 30m -run Test -skip TestLibvirt -v ./test/vmtier/...

.PHONY: libvirt-assets
libvirt-assets: ## Debian 12's libvirt daemon, pinned (hack/libvirt.sh; the packages are cached under ~/.cache/lockstep/libvirt), and lockstep's QEMU image's files, which the libvirt stack's launchers mount (hack/qemu-image.sh).
	hack/libvirt.sh >/dev/null
	hack/qemu-image.sh >/dev/null

.PHONY: test-libvirt
test-libvirt: vm-assets libvirt-assets debian-guest-assets ## The libvirt tier: the VM tier's scenarios with each member launched as KubeVirt's virt-launcher would, through the KubeVirt hook and a libvirt daemon of its own, and what libvirt does to a COLO member; each of make bench-workloads' drivers once, briefly, on the Debian guest unprotected.
	hack/gotest.sh libvirt -tags vmtier -count=1 -timeout 30m -run TestLibvirt -v ./test/vmtier/...

.PHONY: test-e2e
test-e2e: ## The end-to-end suite on the local cluster (hack/local-cluster.sh); E2E_KEEP=1 leaves it up.
	hack/gotest.sh e2e -tags e2e -count=1 -timeout 45m -v ./test/e2e/... -ginkgo.v -ginkgo.timeout=45m

.PHONY: test-fullstack
test-fullstack: vm-assets libvirt-assets debian-guest-assets ## Every part together on the local cluster (FULL_STACK=1): lockstepd on each node's host, members booted through the KubeVirt hook and libvirt with real QEMU; failovers, a partition, a silent node, a node cut from the control plane, the operator killed mid-failover, a node's clock three minutes behind through a failover, then a seeded schedule of faults (QEMU, lockstepd, the logging link, nodes, the operator, a node cut from the control plane, a node's clock set minutes off; FULLSTACK_CHAOS_CUT_API=0 and FULLSTACK_CHAOS_CLOCK_SKEW=0 leave those out: FULLSTACK_CHAOS_SEED, FULLSTACK_CHAOS_STEPS, default 6), with a client checking the VM (needs root); FULLSTACK_KEEP=1 leaves it up.
	hack/gotest.sh fullstack -tags fullstack -count=1 -timeout 45m -v ./test/fullstack/... -ginkgo.v -ginkgo.timeout=45m

.PHONY: test-kubevirt
test-kubevirt: envtest-assets kubevirt-assets ## KubeVirt's own virt-api and virt-controller (v1.9.0, make kubevirt-assets) against a real API server with KubeVirt's CRDs, RBAC and webhooks from virt-operator's install strategy: members pass virt-api's admission unchanged, KubeVirt's converter defines the reference domains, its eviction interceptor evacuates a drained member, lockstep's Plugin passes its validator, launcher pods are sized as placement counts, lockstep's policies change members' pods only.
	hack/gotest.sh kubevirt -count=1 -timeout 10m -v ./test/kubevirt/...

.PHONY: test-scale
test-scale: ## 200 FaultTolerantVMs of mixed sizes (then 40 more than fit, deleted again) on 50 nodes with per-node limits, then 5 nodes killed at once: no node above its limit, never two primaries, and in the end nothing waits that fits (a check of invariants; its figures are reported, not asserted). SCALE_KEEP=1 leaves the cluster up.
	hack/gotest.sh scale -tags scale -count=1 -timeout 45m -run TestScale -v ./test/scale/

.PHONY: soak
soak: vm-assets libvirt-assets debian-guest-assets ## Not in CI: the full stack's seeded schedule of faults at length (nodes cut from the control plane and clocks set off among them), SOAK_STEPS (default 40) steps of SOAK_SEED (default: the clock), the guest's ledger, mail and counter checked after every step; prints the counts (needs root)
	FULLSTACK_CHAOS_STEPS=$${SOAK_STEPS:-40} FULLSTACK_CHAOS_SEED=$${SOAK_SEED:-} hack/gotest.sh soak -tags fullstack -count=1 -timeout 300m -v ./test/fullstack/... \
		-ginkgo.v -ginkgo.timeout=300m -ginkgo.focus='reaches Protected|seeded schedule'

.PHONY: bench-scale
bench-scale: ## The scale run at size: 1,000 FaultTolerantVMs (then 200 more, deleted again) on 500 nodes, 50 killed at once; prints the figures (apply → Protected, operator memory and CPU, reconcile latency, API requests per VM, re-protection after the grace).
	SCALE_NODES=$${SCALE_NODES:-500} SCALE_FTVMS=$${SCALE_FTVMS:-1000} SCALE_EXTRA=$${SCALE_EXTRA:-200} KWOKCTL_CONFIG=$${KWOKCTL_CONFIG:-$(CURDIR)/hack/kwokctl-scale.yaml} \
	  go test -tags scale -count=1 -timeout 90m -run TestScale -v ./test/scale/

.PHONY: test-helm
test-helm: ## helm install, upgrade and uninstall on a local cluster of its own (lockstep-helm; HELM_KEEP=1 leaves it up).
	hack/gotest.sh helm -tags helm -count=1 -timeout 20m -v ./test/helm/... -ginkgo.v -ginkgo.timeout=20m

.PHONY: test-chaos
test-chaos: ## The seeded chaos suite on its own local cluster: CHAOS_SEED (default: the clock), CHAOS_STEPS (default 40), CHAOS_BUDGET (default 3m of faults unless CHAOS_STEPS is set); CHAOS_KEEP=1 leaves the cluster up.
	hack/gotest.sh chaos -tags chaos -count=1 -timeout 90m -v ./test/chaos/... -ginkgo.v -ginkgo.timeout=90m

.PHONY: bench
bench: envtest-assets test-crds vm-assets libvirt-assets ## Data-plane benchmarks beside their baselines (TCP, TLS, round trip; a checkpoint's stream through both relays against one Unix socket), as ratios; failover time over KILLS (50) kills; what COLO costs a VM (request/response, mail-like and bulk loads, unprotected and protected, as ratios); the COLO pair's checkpoints, bandwidth and FAILOVERS (50) failovers on QEMU, launched directly and through the KubeVirt hook and libvirt; a whole resync against an incremental one after the same writes; FULLSTACK_KILLS (20) kills of the primary's node on the full stack.
	{ go test -run '^$$' -bench . -benchtime $${BENCHTIME:-3s} ./internal/channel/ ./internal/relay/ && \
	  go test -run '^$$' -bench Failover -benchtime $${KILLS:-50}x -timeout 30m ./test/dataplane/ && \
	  go test -tags vmtier -run '^$$' -bench 'ColoCost|ColoFailover|ColoResync' -benchtime 1x -timeout 90m -v ./test/vmtier/ && \
	  go test -tags fullstack -run '^$$' -bench FullStackFailover -benchtime 1x -timeout 60m -v ./test/fullstack/; } | go run ./hack/benchreport

.PHONY: bench-workloads
bench-workloads: vm-assets libvirt-assets debian-guest-assets ## What protection costs real workloads, the white paper's table (docs/performance.md): a C build, iperf3 both ways, a stream written once (dd to a socket), sockperf ping-pong, fio random reads and writes at 2 and 64 KiB, pgbench on PostgreSQL, Send Mail under smtp-source on Postfix, in the Debian guest through the libvirt stack, unprotected then protected in one run; WORKLOADS_SPAN (20s) a row, WORKLOADS_VCPUS (1), WORKLOADS_ONLY (names), WORKLOADS_PIN=1 (each member's QEMU on a core of its own); the report in WORKLOADS_OUT, its table printed and its chart in WORKLOADS_PNG.
	WORKLOADS_OUT=$(WORKLOADS_OUT) go test -tags vmtier -run '^$$' -bench Workloads -benchtime 1x -timeout 60m -v ./test/vmtier/ && \
	  go run ./hack/benchreport -workloads $(WORKLOADS_OUT) -png $(WORKLOADS_PNG)

.PHONY: demo
demo: ## Start a 6-node local cluster, protect the samples, kill a node, show the failover; KEEP=1 leaves it up.
	hack/demo.sh

.PHONY: cluster-up
cluster-up: ## Start the local cluster (6 nodes, operator, KubeVirt test double); idempotent.
	hack/local-cluster.sh up 6

.PHONY: cluster-down
cluster-down: ## Stop the local cluster and remove it; idempotent.
	hack/local-cluster.sh down

.PHONY: envtest-assets
envtest-assets: ## Build (once, cached) kube-apiserver and etcd from source into bin/k8s.
	hack/build-k8s-binaries.sh kube-apiserver etcd

.PHONY: kubevirt-assets
kubevirt-assets: envtest-assets ## Build (once, cached) KubeVirt v1.9.0's own virt-operator, virt-api and virt-controller, and hack/kubevirt/domainxml (KubeVirt's converter as a command), from its Go module into bin/kubevirt (hack/build-kubevirt.sh, which lists the modules it replaces and why; virt-launcher on demand: hack/build-kubevirt.sh virt-launcher), its install strategy as virt-operator generates it (bin/kubevirt/install-strategy.yaml) and the KubeVirt CRD as KubeVirt's resource-generator writes it.
	hack/build-kubevirt.sh virt-operator virt-api virt-controller resource-generator domainxml
	test -s $(BIN)/kubevirt/install-strategy.yaml || go run ./hack/kubevirtstrategy -virt-operator $(BIN)/kubevirt/virt-operator -out $(BIN)/kubevirt/install-strategy.yaml
	test -s $(BIN)/kubevirt/kubevirt-crd.yaml || $(BIN)/kubevirt/resource-generator --type=kv --namespace=kubevirt > $(BIN)/kubevirt/kubevirt-crd.yaml

.PHONY: test-crds
test-crds: ## Produce the KubeVirt, Multus, cert-manager and monitoring CRDs for tests into bin/test-crds.
	hack/test-crds.sh

##@ Build

.PHONY: installer
installer: manifests $(KUSTOMIZE) ## Render config/default (CRD, RBAC, operator) into bin/install.yaml.
	$(KUSTOMIZE) build config/default > $(BIN)/install.yaml
	$(KUSTOMIZE) build config/lockstepd > $(BIN)/install-lockstepd.yaml

.PHONY: build
build: ## Build the binaries into bin/ (the kubectl plugin kubectl-ftvm among them, and the KubeVirt test double of the local cluster).
	go build -ldflags "$(VERSION_LDFLAGS)" -o $(BIN)/lockstep-operator ./cmd/lockstep-operator
	go build -ldflags "$(VERSION_LDFLAGS)" -o $(BIN)/lockstepd ./cmd/lockstepd
	go build -ldflags "$(VERSION_LDFLAGS)" -o $(BIN)/lockstep-kubevirt-hook ./cmd/lockstep-kubevirt-hook
	go build -ldflags "$(VERSION_LDFLAGS)" -o $(BIN)/kubectl-ftvm ./cmd/kubectl-ftvm
	go build -o $(BIN)/kubevirt-double ./test/kubevirtdouble/cmd/kubevirt-double

IMAGE_BINARIES := lockstep-operator lockstepd lockstep-kubevirt-hook

.PHONY: images image qemu-image
images: image qemu-image ## Both images as OCI archives, built with no container daemon (hack/imagebuild): `image` and `qemu-image`.

image: ## lockstep's image (the operator, lockstepd and the hook; non-root, no base image): bin/images/lockstep.oci.tar. Needs only Go.
	@mkdir -p $(BIN)/image
	for b in $(IMAGE_BINARIES); do \
		CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags "-s -w -buildid= $(VERSION_LDFLAGS)" -o $(BIN)/image/$$b ./cmd/$$b; done
	go run ./hack/imagebuild -bin $(BIN)/image -out $(BIN)/images/lockstep.oci.tar -ref $(IMG) -version $(VERSION)

qemu-image: ## lockstep's QEMU for members' launchers (hack/qemu-image.sh: the patched QEMU with its libraries and firmware from pinned Debian packages): bin/images/lockstep-qemu.oci.tar. Needs Debian 12's apt and root (the QEMU build, about 4 minutes cold; patchelf).
	VERSION=$(VERSION) hack/qemu-image.sh --oci $(BIN)/images/lockstep-qemu.oci.tar $(QEMU_IMG) >/dev/null

.PHONY: test-images
test-images: images ## The images: their users, entrypoints and digests; lockstep's binaries run from its layer, and its QEMU from an otherwise empty root, as uid 107 (needs root).
	hack/gotest.sh images -count=1 -v ./test/images/...

.PHONY: run
run: manifests ## Run the operator against the current kubeconfig.
	go run ./cmd/lockstep-operator --leader-elect=false --metrics-secure=false

##@ Tools

$(CONTROLLER_GEN):
	hack/tools.sh controller-gen
$(BUF):
	hack/tools.sh buf
$(PROTOC_GEN_GO):
	hack/tools.sh protoc-gen-go
$(PROTOC_GEN_GO_GRPC):
	hack/tools.sh protoc-gen-go-grpc
$(GINKGO):
	hack/tools.sh ginkgo
$(KUSTOMIZE):
	hack/tools.sh kustomize
$(HELM):
	hack/tools.sh helm
$(PROMTOOL):
	hack/tools.sh promtool
