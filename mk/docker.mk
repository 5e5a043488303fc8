# Docker provider targets (controller/docker, compassctl env, images/, e2e/).

.PHONY: images bench-env e2e-docker

# The sidecar and probe images, FROM scratch, offline.
images: build
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ ./images/probe
	$(BIN)/compassctl env image build --binary $(BIN)/compass-proxy --probe --probe-binary $(BIN)/probe

# Open, switch (rules only; rules plus rewiring) and close times over 50 tasks, p50 and
# p99, against the raw Docker operations measured in the same run.
bench-env:
	$(GO) test -count=1 -run '^$$' -bench '^BenchmarkEnvLifecycle$$' -benchtime 1x -timeout 30m ./e2e/dockerenv/

# Only the Docker e2e tests.
e2e-docker:
	$(GO) test -race -count=1 -v -timeout 15m ./e2e/dockerenv/
