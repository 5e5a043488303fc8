package dockerenv

import (
	"context"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"

	"github.com/compass-egress/compass-egress/e2e/harness"
)

// Close lets the sidecar exit on its own before removing it: the engine reports a
// SIGTERM and then an exit code of 0, so compass-proxy ran its drain and wrote every
// log line it had batched (a forced removal kills it with SIGKILL: exit code 137).
func TestCloseLetsTheSidecarExit(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 3*time.Minute)
	e := h.Open(t, h.Provider(t), "close", allowlist)
	proxy := netip.AddrPortFrom(e.SidecarAddr(), 3128).String()
	// An allowed request: its decision line is still batched when the close begins.
	res, err := h.ExecProbe(ctx, e.AgentContainer(), []harness.Check{
		{Name: "allowed", Kind: "proxy", Target: "allowed.test:443", Proxy: proxy},
	})
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	if !res["allowed"].Reachable {
		t.Fatalf("allowed request failed: %s", res["allowed"].Detail)
	}

	// The engine replays events since the given time, so none is missed between the
	// subscription and the close.
	since := strconv.FormatInt(time.Now().Add(-time.Second).Unix(), 10)
	evctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs, errs := h.Docker.Events(evctx, events.ListOptions{Since: since, Filters: filters.NewArgs(
		filters.Arg("type", string(events.ContainerEventType)), filters.Arg("container", e.SidecarContainer()))})
	if err := e.Close(ctx, false); err != nil {
		t.Fatalf("close: %v", err)
	}
	var signals []string
	exit := ""
	for destroyed := false; !destroyed; {
		select {
		case m := <-msgs:
			switch m.Action {
			case events.ActionKill:
				signals = append(signals, m.Actor.Attributes["signal"])
			case events.ActionDie:
				exit = m.Actor.Attributes["exitCode"]
			case events.ActionDestroy:
				destroyed = true
			}
		case err := <-errs:
			t.Fatalf("events: %v", err)
		case <-ctx.Done():
			t.Fatalf("no destroy event for the sidecar; signals %v, exit code %q", signals, exit)
		}
	}
	if len(signals) != 1 || signals[0] != "15" || exit != "0" {
		t.Fatalf("sidecar got signals %v and exited with %q, want SIGTERM (15) alone and exit code 0", signals, exit)
	}
}
