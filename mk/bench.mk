# make bench-proxy: compass-proxy against direct connections, squid and tinyproxy, on
# loopback, and (as root) compass-proxy's transparent path beside its explicit one in
# network namespaces the run creates and removes, in one run of a few minutes; prints
# Markdown tables (method: docs/bench.md).
# The peers come from Debian when missing; they are never started as system services:
# proxybench runs them on 127.0.0.1 high ports with its own configuration and stops them.

# Extra proxybench flags, e.g. BENCH_FLAGS='-rounds 5', BENCH_FLAGS='-workloads setups' or
# BENCH_FLAGS='-transparent=false'.
BENCH_FLAGS     ?=

.PHONY: bench-proxy bench-peers

bench-proxy: build bench-peers
	$(GO) run ./bench/cmd/proxybench -compass $(CURDIR)/$(BIN)/compass-proxy \
		-squid "$$(command -v squid || echo /usr/sbin/squid)" \
		-tinyproxy "$$(command -v tinyproxy || echo /usr/bin/tinyproxy)" $(BENCH_FLAGS)

# Installs squid and tinyproxy if either is missing. A temporary policy-rc.d (the Debian
# mechanism for it) keeps the packages' maintainer scripts from starting the services.
bench-peers:
	@if command -v squid >/dev/null 2>&1 || [ -x /usr/sbin/squid ]; then squid=; else squid=squid; fi; \
	if command -v tinyproxy >/dev/null 2>&1 || [ -x /usr/bin/tinyproxy ]; then tiny=; else tiny=tinyproxy; fi; \
	if [ -n "$$squid$$tiny" ]; then \
		set -e; \
		if [ ! -e /usr/sbin/policy-rc.d ]; then \
			printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; \
			trap 'rm -f /usr/sbin/policy-rc.d' EXIT; \
		fi; \
		apt-get update; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$squid $$tiny; \
	fi
