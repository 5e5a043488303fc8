# Docker provider targets (controller/docker, compassctl env, images/, e2e/).

.PHONY: images bench-env e2e-docker scale-env busybox-static

# The sidecar and probe images, FROM scratch, offline.
images: build
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ ./images/probe
	$(BIN)/compassctl env image build --binary $(BIN)/compass-proxy --probe --probe-binary $(BIN)/probe

# Open, switch (rules only; rules plus rewiring) and close times over 50 tasks, p50 and
# p99, against the raw Docker operations measured in the same run.
bench-env:
	$(GO) test -count=1 -run '^$$' -bench '^BenchmarkEnvLifecycle$$' -benchtime 1x -timeout 30m ./e2e/dockerenv/

# Only the Docker e2e tests.
e2e-docker: busybox-static
	$(GO) test -race -count=1 -v -timeout 15m ./e2e/dockerenv/

# The scale target: SCALE_ENVS environments (default 200) opened at once on this host,
# switched, checked and closed, with nothing left behind; prints the time of each stage.
SCALE_ENVS ?= 200
scale-env:
	CI=1 COMPASS_E2E_SCALE_ENVS=$(SCALE_ENVS) $(GO) test -count=1 -v -run '^TestConcurrentEnvironments$$' -timeout 60m ./e2e/dockerenv/

# The e2e tests' clients that ignore proxies run Debian's static busybox, which the
# harness copies into a FROM-scratch image. Installed only when missing, as bench-peers
# installs its peers (the package conflicts with the dynamic busybox, which it replaces).
busybox-static:
	@if dpkg-query -W -f '$${Status}' busybox-static 2>/dev/null | grep -q 'ok installed'; then :; else \
		set -e; apt-get update; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends busybox-static; \
	fi
