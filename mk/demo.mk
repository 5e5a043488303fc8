# `make demo-run`: the whole product on this machine, offline. Builds the binaries and the
# FROM-scratch images (proxy, fake internet, demo agent and grader), starts a local fake
# internet (packages.test, model.test, judge.test, git.test, exfil.test), runs the two
# tasks of examples/demo with `compassctl run`, prints per task what was attempted in each
# phase (through the proxy and by a client that ignores it) and what happened, checks every
# outcome, and removes every container, network and image it made. Records stay in DEMO_OUT. It is the e2e test TestDemo (CI runs it too).
DEMO_OUT ?= $(CURDIR)/out/demo

.PHONY: demo-run
demo-run:
	rm -rf $(DEMO_OUT)
	COMPASS_DEMO_OUT=$(DEMO_OUT) CI=1 $(GO) test -count=1 -timeout 10m -run '^TestDemo$$' -v ./e2e/
