package dockerenv

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/e2e/harness"
)

// --proxy-arg reaches new sidecars, and --deny-private keeps the sandbox off private-use
// addresses: the fake internet lives on a Docker network from a private pool, so under
// a denylist it is out of reach through the sidecar, by name and by address. An
// allowlist naming its address lifts the guard for that one address: the same name then
// answers, so the refusals were the guard's, not a dead path.
func TestSidecarDenyPrivate(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 3*time.Minute)
	if !netip.MustParsePrefix("172.16.0.0/12").Contains(h.Fakenet) && !netip.MustParsePrefix("192.168.0.0/16").Contains(h.Fakenet) &&
		!netip.MustParsePrefix("10.0.0.0/8").Contains(h.Fakenet) {
		t.Fatalf("the fake internet %s is not on a private-use address (Docker's default pools are)", h.Fakenet)
	}
	cfg := h.Config()
	cfg.ExtraProxyArg = []string{"--deny-private"}
	p, err := docker.New(h.Docker, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := h.Open(t, p, "denypriv", denylist)
	proxy := netip.AddrPortFrom(e.SidecarAddr(), 3128).String()
	checks := []harness.Check{
		{Name: "by-name", Kind: "proxy", Target: "allowed.test:443", Proxy: proxy},
		{Name: "by-address", Kind: "proxy", Target: netip.AddrPortFrom(h.Fakenet, 443).String(), Proxy: proxy},
	}
	res, err := h.ExecProbe(ctx, e.AgentContainer(), checks)
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	for _, c := range checks {
		if r := res[c.Name]; r.Reachable || !strings.Contains(r.Detail, "403") {
			t.Errorf("denylist with --deny-private: %s (%s): %s, want 403", c.Name, c.Target, r.Detail)
		}
	}
	only := mustParse(`{"network_mode":"allowlist","allowed_hosts":["` + h.Fakenet.String() + `"]}`)
	if _, err := e.Apply(ctx, only, controller.PhaseLabel{Phase: "control"}); err != nil {
		t.Fatalf("switch: %v", err)
	}
	res, err = h.ExecProbe(ctx, e.AgentContainer(), checks[:1])
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	if r := res["by-name"]; !r.Reachable {
		t.Errorf("an allowlist naming %s: allowed.test through the sidecar: %s, want it answered", h.Fakenet, r.Detail)
	}
}
