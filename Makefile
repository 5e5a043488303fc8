# Every entry point of compass-egress. Nothing here reaches the internet: images are built
# FROM scratch from our static binaries, and tests talk only to addresses on this machine.

GO        ?= go
BIN       := bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/compass-egress/compass-egress/internal/buildinfo.Version=$(VERSION)
GOFILES    = $(shell git ls-files '*.go' 2>/dev/null; git ls-files --others --exclude-standard '*.go' 2>/dev/null)

.PHONY: all build test fmt-check vet tidy-check unit demo bench bench-policy fuzz clean

all: build

# Static binaries: the sidecar image is FROM scratch, so nothing may link libc.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

fmt-check:
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# go.mod and go.sum say exactly what the code imports: go mod tidy -diff prints what it
# would change and exits 1.
tidy-check:
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run 'go mod tidy' and commit the result"; exit 1; }

# The one test command (README, .ci/run): formatting, vet, tidy go.mod, then every test with the race
# detector, the e2e tests against the real Docker Engine included. internal/testreport
# prints what go test prints, then lists every skipped test with its reason.
#
# SCALE_TEST opens 50 environments at once. On a 2-CPU host that stalls the engine for
# minutes (another environment's close took 96 s meanwhile), so it runs on its own, after
# every other package: go test runs packages side by side, and the e2e package's Docker
# calls would queue behind it.
SCALE_TEST := ^TestConcurrentEnvironments$$
test: fmt-check vet tidy-check busybox-static
	$(GO) run ./internal/testreport -race -count=1 -timeout 18m -skip '$(SCALE_TEST)' ./...
	$(GO) run ./internal/testreport -race -count=1 -timeout 10m -run '$(SCALE_TEST)' ./e2e/dockerenv/

# Unit tests only (no Docker): quick feedback while editing.
unit:
	$(GO) test -race -count=1 -short ./...

# The main job: see README.md for what it shows.
demo: demo-run

# Benchmarks print ratios against a baseline measured in the same run: the matcher
# against its linear reference, the proxy against direct connections, squid and tinyproxy.
bench: bench-policy bench-proxy

bench-policy:
	$(GO) test -run '^$$' -bench . -benchmem ./policy/

# Each fuzz target of every package, found by go test -list, for FUZZTIME (default 1m).
FUZZTIME ?= 1m
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
		for target in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
			echo "== $$pkg $$target"; \
			$(GO) test $$pkg -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME); \
		done; \
	done

clean:
	rm -rf $(BIN) out

# Each feature's extra targets live in mk/<feature>.mk.
-include mk/*.mk
