# compass-proxy: the sidecar image and its measurements (see docs/proxy.md).

PROXY_IMAGE ?= compass-proxy:latest

.PHONY: image bench-image

# The sidecar image, offline: the build context is a temporary directory holding only the
# static binary, Dockerfile.proxy and the empty directory it copies to /run/compass, and
# FROM scratch needs no pull.
image:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/compass-proxy ./cmd/compass-proxy
	@ctx=$$(mktemp -d) && trap 'rm -rf "$$ctx"' EXIT && \
	cp $(BIN)/compass-proxy "$$ctx/compass-proxy" && cp Dockerfile.proxy "$$ctx/Dockerfile" && \
	mkdir "$$ctx/run-compass" && \
	docker build -q --build-arg VERSION=$(VERSION) -t $(PROXY_IMAGE) "$$ctx" >/dev/null && \
	echo "built $(PROXY_IMAGE): $$(docker image inspect -f '{{.Size}}' $(PROXY_IMAGE)) bytes"

# Image size and `docker start` -> ready (the proxy answers /readyz on its admin socket, the
# HEALTHCHECK's own probe), over BENCH_IMAGE_RUNS runs, with --network none: no traffic.
BENCH_IMAGE_RUNS ?= 10
bench-image: image
	@set -eu; image=$(PROXY_IMAGE); runs=$(BENCH_IMAGE_RUNS); \
	size=$$(docker image inspect -f '{{.Size}}' $$image); \
	echo "image $$image: $$size bytes ($$(( size / 1024 )) KiB)"; \
	dir=$$(mktemp -d); chmod 777 $$dir; name=compass-proxy-bench-$$$$; \
	trap 'docker rm -f '$$name' >/dev/null 2>&1 || true; rm -rf '$$dir EXIT; \
	total=0; \
	for i in $$(seq 1 $$runs); do \
		docker rm -f $$name >/dev/null 2>&1 || true; rm -f $$dir/admin.sock; \
		docker create --name $$name --network none \
			--sysctl net.ipv4.ip_unprivileged_port_start=0 --sysctl net.ipv4.ip_forward=0 \
			-v $$dir:/run/compass $$image --dns-upstream 127.0.0.1:1 >/dev/null; \
		start=$$(date +%s%N); docker start $$name >/dev/null; \
		until curl -sf --unix-socket $$dir/admin.sock http://x/readyz >/dev/null 2>&1; do \
			if [ $$(( ($$(date +%s%N) - start) / 1000000 )) -gt 10000 ]; then docker logs $$name; exit 1; fi; \
			sleep 0.005; \
		done; \
		ms=$$(( ($$(date +%s%N) - start) / 1000000 )); total=$$(( total + ms )); \
		echo "run $$i: docker start -> ready in $$ms ms"; \
	done; \
	echo "mean docker start -> ready: $$(( total / runs )) ms over $$runs runs"
