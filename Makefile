# kvindex developer commands. The two that matter:
#   make demo   run kvindex's main job on its embedded default (no external servers)
#   make test   the checks (gofmt, go.mod and go.sum tidy, go vet,
#               staticcheck, the cgo-free check, the
#               golden-file generators reproduce their files), every
#               test with the race detector, the race-shortened tests without it,
#               the decoder's tests against the msgpack library's reader,
#               and a short run of every fuzz target (make fuzz)
#   make faults the fault-injection suite (internal/faultlab, also part of
#               make test) printing one table: per fault, the answers
#               checked, those wrong for an engine reported ok (must be 0),
#               those wrong for a flagged one, time to recover, peak RSS

# Go: the one on PATH, else the standard install's (/usr/local/go/bin, not
# on every PATH), whose directory then goes first on the PATH of every
# command here, so that tools and tests that run go find it too.
ifeq ($(origin GO),undefined)
GO := $(or $(shell command -v go 2>/dev/null),$(wildcard /usr/local/go/bin/go),go)
endif
GO_DIR := $(patsubst %/,%,$(dir $(filter /%,$(GO))))
ifneq ($(GO_DIR),)
export PATH := $(GO_DIR):$(PATH)
endif
PKGS    := ./...
MODULE  := github.com/kvindex/kvindex
BENCH   ?= .
# System packages (Debian names). The build needs gcc, the C compiler cgo
# needs, and libzmq for the ZMQ transport (cgo). The tests also need Python's
# zmq and msgpack for the interop test, cbor2 and xxhash (with msgpack) for
# the golden-file generators, and nginx with its njs module for
# deploy/nginx's end-to-end test (which runs its own nginx, unprivileged, on
# free ports), and Debian's nats-server for the NATS mode's end-to-end test
# (which runs its own server on a free port), and Debian's prometheus for
# promtool, which checks and unit-tests deploy/monitoring's alerting rules,
# and protoc with its Python gRPC plugin, python3-grpcio and python3-protobuf
# for api/README.md's Python client, which a docs test generates and runs.
# make proto needs protoc alone (DEB_PROTO_PKGS).
DEB_BUILD_PKGS := gcc libzmq3-dev pkg-config
DEB_PROTO_PKGS := protobuf-compiler
DEB_TEST_PKGS  := $(DEB_BUILD_PKGS) python3-zmq python3-msgpack python3-cbor2 python3-xxhash nginx libnginx-mod-http-js nats-server prometheus \
	$(DEB_PROTO_PKGS) protobuf-compiler-grpc python3-grpcio python3-protobuf

# The packages that must build without cgo (no libzmq, no C compiler): the
# core, the Go client and the server (only kvevents/zmqtransport needs libzmq),
# and internal/testutil, which their tests share.
CGO_FREE := ./blockhash/... ./kvevents ./kvevents/enginesim ./kvevents/natstransport ./indexer/... ./api/client ./api/server ./api/server/security ./api/watchhub ./tokenizer/... ./picker/... ./kvevents/enginesim/simhttp ./internal/statefile ./internal/snapstore ./internal/kubediscovery ./internal/bytesize ./internal/memlimit ./internal/flagsource ./internal/configerr ./internal/lifecycle ./internal/inflight ./internal/testutil ./internal/jsonstr ./internal/top ./internal/doctor
# Packages whose tests skip or shrink under the race detector (they carry a
# `//go:build race` file); their tests also run once without it.
NORACE_PKGS = $(sort $(dir $(shell grep -rl --include='*_test.go' '^//go:build race' .)))
STATICCHECK_VERSION := v0.8.2
TOOLS := $(CURDIR)/bin/tools
STATICCHECK := $(TOOLS)/staticcheck-$(STATICCHECK_VERSION)

.PHONY: all build demo test check bench deps test-deps proto-deps proto clean faults fuzz

all: build

# deps installs what the build needs, test-deps what the tests need too.
deps: DEB_NEEDED = $(DEB_BUILD_PKGS)
test-deps: DEB_NEEDED = $(DEB_TEST_PKGS)
proto-deps: DEB_NEEDED = $(DEB_PROTO_PKGS)
deps test-deps proto-deps:
	@missing=""; for p in $(DEB_NEEDED); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get install -y $$missing >/dev/null || { $$SUDO apt-get update >/dev/null && $$SUDO apt-get install -y $$missing >/dev/null; }; \
		case " $$missing " in *" nginx "*) \
			echo "stopping and disabling the nginx system service the package started (the tests run their own)"; \
			{ $$SUDO systemctl disable --now nginx || $$SUDO service nginx stop; } >/dev/null 2>&1 || true;; \
		esac; \
		case " $$missing " in *" nats-server "*) \
			echo "stopping and disabling the nats-server system service the package started (the tests run their own)"; \
			{ $$SUDO systemctl disable --now nats-server || $$SUDO service nats-server stop; } >/dev/null 2>&1 || true;; \
		esac; \
		case " $$missing " in *" prometheus "*) \
			echo "stopping and disabling the prometheus and node exporter system services the package started (the tests need only promtool)"; \
			for svc in prometheus prometheus-node-exporter; do \
				{ $$SUDO systemctl disable --now $$svc || $$SUDO service $$svc stop; } >/dev/null 2>&1 || true; \
			done;; \
		esac; \
	fi

build: deps
	$(GO) build -buildvcs=auto -o bin/kvindex ./cmd/kvindex

demo: build
	./bin/kvindex demo

$(STATICCHECK):
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(TOOLS)/staticcheck $@

# The checks and the tests compile each build once: the race build (go vet
# and staticcheck read it, the tests run on it) and the plain one (the
# kvindex binary the fault suite and the README's examples run, and the
# packages with a race variant, vetted, checked and tested once more
# without the race detector). That the cgo-free packages build without cgo
# is checked without a third compile: .ci/cgo-free proves that no package
# they import (the standard library aside) has a file that only a cgo
# build takes, so they compile as in the race build. The fuzz run compiles
# its own, instrumented build.
check: $(STATICCHECK)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) mod tidy -diff
	$(GO) vet -race $(PKGS)
	GOFLAGS=-race $(STATICCHECK) $(PKGS)
	$(GO) vet $(NORACE_PKGS)
	$(STATICCHECK) $(NORACE_PKGS)
	GO='$(GO)' .ci/cgo-free $(CGO_FREE)

# The binary the fault suite and the README's examples run is built once,
# before the tests that build it would each compile it at the same time.
# The race tests run four packages at once, as many of them wait on
# sockets and timers; the fuzz run's build goes on meanwhile at the lowest
# priority, on what cores they leave. The fault suite runs afterwards, alone:
# its flood row measures kvindex's peak resident memory, which a starved
# garbage collector would inflate.
FAULTLAB := ./internal/faultlab
test: test-deps check golden-check build
	@GO='$(GO)' nice -n 19 .ci/fuzz --build >bin/fuzz-build.log 2>&1 & fuzzbuild=$$!; \
	pkgs=$$($(GO) list $(PKGS) | grep -vx '$(MODULE)/$(FAULTLAB:./%=%)'); \
	echo "$(GO) test -race -p 4 -count=1 $(PKGS) (but $(FAULTLAB))"; \
	$(GO) test -race -p 4 -count=1 $$pkgs; rc=$$?; \
	wait $$fuzzbuild || { echo "building the fuzz test binaries failed:"; cat bin/fuzz-build.log; }; \
	exit $$rc
	$(GO) test -race -count=1 $(FAULTLAB)
	$(GO) test -count=1 $(NORACE_PKGS)
	$(GO) test -count=1 -tags kvevents_msgpacklib ./kvevents
	$(FUZZ_RUN)

# Fuzz every fuzz target (found in the source by .ci/fuzz) for FUZZTIME
# each (default in .ci/fuzz), one after the other, as `go test -fuzz` takes
# one target per run; FUZZ narrows them by name (make fuzz FUZZ=Decode
# FUZZTIME=5m).
export FUZZTIME FUZZ
FUZZ_RUN = GO='$(GO)' .ci/fuzz
fuzz: test-deps
	$(FUZZ_RUN)

# The fault-injection suite, run from a compiled test binary so that its
# output is the fault table (and the failures, if any) without go test's
# per-test lines; go test -v ./internal/faultlab shows kvindex's logs too.
faults: test-deps
	$(GO) test -c -o bin/faultlab.test ./internal/faultlab
	cd internal/faultlab && ../../bin/faultlab.test -test.count=1 -test.parallel 1 -test.run '^TestFaults$$' -faults.table

# Benchmarks the issues ask for; BENCH narrows them (make bench BENCH=Chain).
bench: deps
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem $(PKGS)

clean:
	rm -rf bin

# Rerun every Python golden-file generator (*/testdata/gen_*.py) in --check
# mode: each recomputes its file (vLLM's block hashes, pickle bytes, the
# msgpack payloads) and fails if the committed one differs. They need
# Debian's python3 with python3-cbor2, python3-msgpack and python3-xxhash.
GOLDEN_PYTHON     ?= /usr/bin/python3
GOLDEN_GENERATORS  = $(sort $(shell find . -path ./bin -prune -o -path '*/testdata/gen_*.py' -print))
.PHONY: golden-check
golden-check:
	@rc=0; for g in $(GOLDEN_GENERATORS); do $(GOLDEN_PYTHON) $$g --check || rc=1; done; exit $$rc

# Regenerate api/ from proto/ with Debian's protoc (3.21.12, installed when
# missing) and pinned plugins.
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
proto: proto-deps
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(TOOLS) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	protoc -I proto \
		--plugin=protoc-gen-go=$(TOOLS)/protoc-gen-go --plugin=protoc-gen-go-grpc=$(TOOLS)/protoc-gen-go-grpc \
		--go_out=. --go_opt=module=github.com/kvindex/kvindex \
		--go-grpc_out=. --go-grpc_opt=module=github.com/kvindex/kvindex \
		proto/kvindex/v1/kvindex.proto proto/indexer/v1/indexer.proto

# Lint the API with buf (buf.yaml) and check it against main for breaking
# changes; buf is built once into bin/tools (a few minutes).
BUF_VERSION := v1.75.0
BUF         := $(TOOLS)/buf-$(BUF_VERSION)
.PHONY: proto-lint
proto-lint:
	@[ -x $(BUF) ] || { GOBIN=$(TOOLS) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION) && mv $(TOOLS)/buf $(BUF); }
	$(BUF) lint
	$(BUF) breaking --against '.git#branch=main,subdir=proto'
