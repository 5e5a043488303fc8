// Package dockerenv tests the Docker provider and `compassctl env` against the real
// Docker Engine: every mode, every transition, failures, and scale.
package dockerenv

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/e2e/harness"
	"github.com/compass-egress/compass-egress/policy"
)

var h *harness.Harness

func TestMain(m *testing.M) {
	code := harness.Main(m, "dockerenv", &h)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// The policies each mode is tested with: allowed.test is allowed by the allowlist and
// not denied by the denylist; blocked.test is neither allowed nor left open.
var (
	allowlist = mustParse(`{"network_mode":"allowlist","allowed_hosts":["allowed.test"]}`)
	denylist  = mustParse(`{"network_mode":"denylist","denied_hosts":["blocked.test"]}`)
	byMode    = map[policy.Mode]policy.Policy{
		policy.ModePublic: policy.Public, policy.ModeNoNetwork: policy.NoNetwork,
		policy.ModeAllowlist: allowlist, policy.ModeDenylist: denylist,
	}
)

func mustParse(s string) policy.Policy {
	p, err := policy.Parse([]byte(s))
	if err != nil {
		panic(err)
	}
	return p
}

func timeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// expectation is what a mode allows, seen from inside the agent. Without the proxy, in
// the restricted modes every TCP connection reaches the sidecar (the transparent path),
// which decides as for the proxy: a TLS name or HTTP Host that the policy allows gets
// through; a request naming only an address is decided on the address, which a denylist
// lets through.
type expectation struct {
	allowedViaProxy, blockedViaProxy, resolvesBlocked bool
	allowedDirect, blockedDirect, addressDirect       bool
}

func expect(m policy.Mode) expectation {
	switch m {
	case policy.ModePublic:
		return expectation{allowedViaProxy: true, blockedViaProxy: true, resolvesBlocked: true,
			allowedDirect: true, blockedDirect: true, addressDirect: true}
	case policy.ModeAllowlist:
		return expectation{allowedViaProxy: true, allowedDirect: true}
	case policy.ModeDenylist:
		return expectation{allowedViaProxy: true, allowedDirect: true, addressDirect: true}
	}
	return expectation{}
}

// assertState checks an environment from outside the controller: docker inspect, the
// agent's routes read with netlink, real requests made from inside the agent with and
// without the proxy, and the controller's own verify and status.
func assertState(t *testing.T, e *docker.Env, mode policy.Mode) {
	t.Helper()
	ctx := timeout(t, 3*time.Minute)
	want := expect(mode)

	nets, err := h.Networks(ctx, e.AgentContainer())
	if err != nil {
		t.Fatalf("inspect agent: %v", err)
	}
	wantNets := []string{e.Network()}
	if mode == policy.ModePublic {
		wantNets = append(wantNets, h.EgressNetwork)
	}
	slices.Sort(wantNets)
	if !slices.Equal(nets, wantNets) {
		t.Errorf("%s: agent networks = %v, want %v", mode, nets, wantNets)
	}

	routes, err := h.DefaultRoutes(ctx, e.AgentContainer())
	if err != nil {
		t.Fatalf("agent routes: %v", err)
	}
	if mode == policy.ModePublic {
		if len(routes) != 1 {
			t.Errorf("public: agent default routes = %v, want exactly one (via the egress gateway)", routes)
		}
	} else if via := "default via " + e.TransparentLink().Gateway().String(); !slices.Equal(routes, []string{via}) {
		t.Errorf("%s: agent default routes = %v, want only the transparent link's (%s)", mode, routes, via)
	}

	proxy := netip.AddrPortFrom(e.SidecarAddr(), 3128).String()
	resolver := netip.AddrPortFrom(e.SidecarAddr(), 53).String()
	res, err := h.ExecProbe(ctx, e.AgentContainer(), []harness.Check{
		{Name: "allowed", Kind: "proxy", Target: "allowed.test:443", Proxy: proxy},
		{Name: "allowed-http", Kind: "proxy", Target: "allowed.test:80", Proxy: proxy},
		{Name: "blocked", Kind: "proxy", Target: "blocked.test:443", Proxy: proxy},
		{Name: "allowed-direct-tls", Kind: "tls", Target: "allowed.test:443", Resolver: resolver, TimeoutMS: 1500},
		{Name: "allowed-direct-http", Kind: "http", Target: "allowed.test:80", Resolver: resolver, TimeoutMS: 1500},
		{Name: "blocked-direct-tls", Kind: "tls", Target: netip.AddrPortFrom(h.Fakenet, 443).String(), Host: "blocked.test", TimeoutMS: 1500},
		{Name: "address-direct-http", Kind: "http", Target: netip.AddrPortFrom(h.Fakenet, 80).String(), TimeoutMS: 1500},
		{Name: "resolve-blocked", Kind: "dns", Server: resolver, QName: "blocked.test"},
	})
	if err != nil {
		t.Fatalf("probe in agent: %v", err)
	}
	for _, c := range []struct {
		name string
		got  bool
		want bool
	}{
		{"allowed", res["allowed"].Reachable, want.allowedViaProxy},
		{"allowed-http", res["allowed-http"].Reachable, want.allowedViaProxy},
		{"blocked", res["blocked"].Reachable, want.blockedViaProxy},
		{"allowed-direct-tls", res["allowed-direct-tls"].Reachable, want.allowedDirect},
		{"allowed-direct-http", res["allowed-direct-http"].Reachable, want.allowedDirect},
		{"blocked-direct-tls", res["blocked-direct-tls"].Reachable, want.blockedDirect},
		{"address-direct-http", res["address-direct-http"].Reachable, want.addressDirect},
		{"resolve-blocked", res["resolve-blocked"].Resolved, want.resolvesBlocked},
	} {
		if c.got != c.want {
			t.Errorf("%s: from inside the agent, %s works=%t, want %t (%s)", mode, c.name, c.got, c.want, res[c.name].Detail)
		}
	}

	rep, err := e.Verify(ctx, docker.VerifyOptions{
		Allowed: allowedFor(mode), Blocked: blockedFor(mode), Outside: h.Fakenet,
		AllowedTCP: allowedTCPFor(mode), BlockedTCP: blockedTCPFor(mode),
	})
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	if !rep.OK {
		t.Errorf("%s: verify found differences: %+v", mode, rep.Rows)
	}
	st, err := e.Status(ctx)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	if !st.OK || st.Sidecar.Mode != mode {
		t.Errorf("%s: status not OK or wrong mode: %+v", mode, st)
	}
}

func allowedFor(m policy.Mode) []string {
	if m == policy.ModeNoNetwork {
		return nil
	}
	return []string{"allowed.test:443", "allowed.test:80"}
}

func blockedFor(m policy.Mode) []string {
	if m == policy.ModePublic {
		return nil
	}
	return []string{"blocked.test:443", "blocked.test:80"}
}

// allowedTCPFor and blockedTCPFor are the fake internet's port 22, which speaks first
// like SSH: allowed.test covers every port of the name.
func allowedTCPFor(m policy.Mode) []string {
	if m == policy.ModeNoNetwork {
		return nil
	}
	return []string{"allowed.test:22"}
}

func blockedTCPFor(m policy.Mode) []string {
	if m == policy.ModePublic {
		return nil
	}
	return []string{"blocked.test:22"}
}
