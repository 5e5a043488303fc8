package dockerenv

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/e2e/harness"
	"github.com/compass-egress/compass-egress/policy"
)

// probeEgress makes the requests that tell a restricted agent's egress from inside it:
// an allowed and a blocked destination through the sidecar, and an allowed name at the
// fake internet's address without the proxy (a TLS handshake: under the transparent
// path a connect alone reaches the sidecar, so only the destination's handshake counts).
func probeEgress(t *testing.T, ctr string, sidecar netip.Addr) map[string]harness.Result {
	t.Helper()
	ctx := timeout(t, 2*time.Minute)
	proxy := netip.AddrPortFrom(sidecar, 3128).String()
	res, err := h.ExecProbe(ctx, ctr, []harness.Check{
		{Name: "allowed", Kind: "proxy", Target: "allowed.test:443", Proxy: proxy},
		{Name: "blocked", Kind: "proxy", Target: "blocked.test:443", Proxy: proxy},
		{Name: "direct", Kind: "tls", Target: netip.AddrPortFrom(h.Fakenet, 443).String(), Host: "allowed.test", TimeoutMS: 1500},
	})
	if err != nil {
		t.Fatalf("probe in agent: %v", err)
	}
	return res
}

// statusReports checks that the controller's status of e is not OK and names want.
func statusReports(t *testing.T, e *docker.Env, want string) {
	t.Helper()
	st, err := e.Status(timeout(t, time.Minute))
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	if st.OK || !strings.Contains(strings.Join(st.Problems, "\n"), want) {
		t.Errorf("status does not report %q: %+v", want, st.Problems)
	}
}

// repairAllowlist puts the allowlist in force again with a switch, and checks the whole
// state from outside the controller.
func repairAllowlist(t *testing.T, e *docker.Env) {
	t.Helper()
	if _, err := e.Apply(timeout(t, 2*time.Minute), allowlist, controller.PhaseLabel{Phase: "repair"}); err != nil {
		t.Fatalf("repairing switch: %v", err)
	}
	assertState(t, e, policy.ModeAllowlist)
}

// A restarted agent gets a fresh network namespace, and Docker gives it back the default
// route through the internal network's gateway that every switch removes (DESIGN.md,
// fact 1). It must still have no way out but the sidecar; status must name the route;
// a switch to the intended policy removes it.
func TestRestartedAgentStaysClosed(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 3*time.Minute)
	e := h.Open(t, h.Provider(t), "restart", allowlist)
	before, err := h.Docker.ContainerInspect(ctx, e.AgentContainer())
	if err != nil {
		t.Fatal(err)
	}
	zero := 0
	if err := h.Docker.ContainerRestart(ctx, e.AgentContainer(), container.StopOptions{Timeout: &zero}); err != nil {
		t.Fatalf("restart agent: %v", err)
	}
	after, err := h.Docker.ContainerInspect(ctx, e.AgentContainer())
	if err != nil {
		t.Fatal(err)
	}
	if after.State.Pid == before.State.Pid {
		t.Fatalf("the agent kept pid %d: not restarted", after.State.Pid)
	}

	res := probeEgress(t, e.AgentContainer(), e.SidecarAddr())
	if !res["allowed"].Reachable {
		t.Errorf("after the restart the allowed destination fails through the sidecar: %s", res["allowed"].Detail)
	}
	for _, name := range []string{"blocked", "direct"} {
		if res[name].Reachable {
			t.Errorf("after the restart %s works: %s", name, res[name].Detail)
		}
	}

	routes, err := h.DefaultRoutes(ctx, e.AgentContainer())
	if err != nil {
		t.Fatalf("agent routes: %v", err)
	}
	t.Logf("after the restart Docker gave the agent default routes %v", routes)
	if slices.Contains(routes, "default via "+e.TransparentLink().Gateway().String()) {
		t.Errorf("the restarted agent kept the transparent link's route: %v", routes)
	}
	// The transparent link went with the agent's old namespace: whatever Docker gave
	// the new one, status reports the link missing until a switch puts it back.
	statusReports(t, e, "transparent path: link "+e.TransparentLink().Link.AgentName+" is missing")
	repairAllowlist(t, e)
}

// A sidecar cut from the egress network by someone else leaves the agent with nothing
// (the sidecar has no way out either) and keeps refusing what the policy refuses;
// status names the cut; a switch reconnects it.
func TestSidecarCutFromEgress(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 3*time.Minute)
	e := h.Open(t, h.Provider(t), "cutsc", allowlist)
	if err := h.Docker.NetworkDisconnect(ctx, h.EgressNetwork, e.SidecarContainer(), true); err != nil {
		t.Fatalf("cut the sidecar from %s: %v", h.EgressNetwork, err)
	}
	res := probeEgress(t, e.AgentContainer(), e.SidecarAddr())
	for name, r := range res {
		if r.Reachable {
			t.Errorf("with the sidecar cut from egress, %s works: %s", name, r.Detail)
		}
	}
	statusReports(t, e, "sidecar is not connected to "+h.EgressNetwork)
	if _, err := e.Apply(ctx, allowlist, controller.PhaseLabel{Phase: "repair"}); err != nil {
		t.Fatalf("repairing switch: %v", err)
	}
	ci, err := h.Docker.ContainerInspect(ctx, e.SidecarContainer())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ci.NetworkSettings.Networks[h.EgressNetwork]; !ok {
		t.Errorf("the switch did not reconnect the sidecar to %s: %v", h.EgressNetwork, keys(ci.NetworkSettings.Networks))
	}
	assertState(t, e, policy.ModeAllowlist)
}

func keys(m map[string]*network.EndpointSettings) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
