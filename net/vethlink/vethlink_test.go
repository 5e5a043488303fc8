package vethlink_test

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/compass-egress/compass-egress/net/netnstest"
	"github.com/compass-egress/compass-egress/net/vethlink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var spec = vethlink.Spec{
	AgentName:   "ce-a0",
	SidecarName: "ce-s0",
	AgentAddr:   netip.MustParsePrefix("169.254.77.1/30"),
	SidecarAddr: netip.MustParsePrefix("169.254.77.2/30"),
}

func handle(t *testing.T, ns netnstest.NS) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(ns.Handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func mustCheck(t *testing.T, agent, sidecar netnstest.NS) []string {
	t.Helper()
	p, err := vethlink.Check(agent.Handle, sidecar.Handle, spec)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	return p
}

func has(problems []string, part string) bool {
	for _, p := range problems {
		if strings.Contains(p, part) {
			return true
		}
	}
	return false
}

// dockerLikeAgent gives the agent namespace what Docker leaves there: an
// interface with an IPv4 default route, plus an IPv6 default route. The
// interface is an empty bridge: some kernels here have no dummy driver.
func dockerLikeAgent(t *testing.T, agent netnstest.NS) {
	h := handle(t, agent)
	eth := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}}
	if err := h.LinkAdd(eth); err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr("198.51.100.10/24")
	if err := h.AddrAdd(eth, addr); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*netlink.Route{
		{LinkIndex: eth.Attrs().Index, Gw: net.ParseIP("198.51.100.1")},
		{LinkIndex: eth.Attrs().Index, Gw: net.ParseIP("198.51.100.2"), Priority: 100},
		{LinkIndex: eth.Attrs().Index, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}},
	} {
		if err := h.RouteAdd(r); err != nil {
			t.Fatalf("add route %s: %v", r, err)
		}
	}
}

func TestEnsureReplacesDefaultRoutes(t *testing.T) {
	agent, sidecar := netnstest.New(t, "veth"), netnstest.New(t, "veth")
	dockerLikeAgent(t, agent)
	before := mustCheck(t, agent, sidecar)
	for _, want := range []string{"link ce-a0 is missing", "link ce-s0 is missing", "not via the sidecar's end", "IPv6 default route"} {
		if !has(before, want) {
			t.Errorf("Check before Ensure = %q, want a problem containing %q", before, want)
		}
	}
	if err := vethlink.Ensure(agent.Handle, sidecar.Handle, spec); err != nil {
		t.Fatal(err)
	}
	if p := mustCheck(t, agent, sidecar); len(p) != 0 {
		t.Fatalf("Check after Ensure: %q", p)
	}
	routes, err := handle(t, agent).RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	var defaults []string
	for _, r := range routes {
		if ones, _ := r.Dst.Mask.Size(); r.Dst == nil || ones == 0 {
			defaults = append(defaults, r.String())
		}
	}
	if len(defaults) != 1 || !strings.Contains(defaults[0], "Gw: 169.254.77.2") {
		t.Fatalf("agent default routes after Ensure = %q, want only via 169.254.77.2", defaults)
	}
}

func TestEnsureIsIdempotent(t *testing.T) {
	agent, sidecar := netnstest.New(t, "veth"), netnstest.New(t, "veth")
	var index int
	for i := range 3 {
		if err := vethlink.Ensure(agent.Handle, sidecar.Handle, spec); err != nil {
			t.Fatalf("Ensure #%d: %v", i+1, err)
		}
		if p := mustCheck(t, agent, sidecar); len(p) != 0 {
			t.Fatalf("Check after Ensure #%d: %q", i+1, p)
		}
		l, err := handle(t, agent).LinkByName(spec.AgentName)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 && l.Attrs().Index != index {
			t.Fatalf("Ensure #%d re-created the link (index %d, was %d)", i+1, l.Attrs().Index, index)
		}
		index = l.Attrs().Index
	}
}

// TestEnsureRepairs: Ensure restores what was broken after it ran, as it must
// after Docker re-adds a route or somebody downs the link.
func TestEnsureRepairs(t *testing.T) {
	tests := []struct {
		name   string
		damage func(t *testing.T, agent, sidecar *netlink.Handle)
		want   []string
	}{
		{"sidecar end down", func(t *testing.T, _, sidecar *netlink.Handle) {
			l, _ := sidecar.LinkByName(spec.SidecarName)
			if err := sidecar.LinkSetDown(l); err != nil {
				t.Fatal(err)
			}
		}, []string{"link ce-s0 in sidecar namespace", "is down", "link ce-a0 in agent namespace", "its operational state is down"}},
		{"agent address gone", func(t *testing.T, agent, _ *netlink.Handle) {
			l, _ := agent.LinkByName(spec.AgentName)
			a, _ := netlink.ParseAddr(spec.AgentAddr.String())
			if err := agent.AddrDel(l, a); err != nil {
				t.Fatal(err)
			}
		}, []string{"lacks address 169.254.77.1/30", "no default route via"}},
		{"extra default route", func(t *testing.T, agent, _ *netlink.Handle) {
			l, _ := agent.LinkByName(spec.AgentName)
			if err := agent.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Priority: 50,
				Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}}); err != nil {
				t.Fatal(err)
			}
		}, []string{"not via the sidecar's end"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			agent, sidecar := netnstest.New(t, "veth"), netnstest.New(t, "veth")
			if err := vethlink.Ensure(agent.Handle, sidecar.Handle, spec); err != nil {
				t.Fatal(err)
			}
			tt.damage(t, handle(t, agent), handle(t, sidecar))
			p := mustCheck(t, agent, sidecar)
			for _, want := range tt.want {
				if !has(p, want) {
					t.Errorf("Check = %q, want a problem containing %q", p, want)
				}
			}
			if err := vethlink.Ensure(agent.Handle, sidecar.Handle, spec); err != nil {
				t.Fatal(err)
			}
			if p := mustCheck(t, agent, sidecar); len(p) != 0 {
				t.Fatalf("Check after repair: %q", p)
			}
		})
	}
}

// TestEnsureRollsBack: when a step after creating the pair fails (here the
// kernel refuses the gateway because a policy rule prohibits it), the pair
// this call created is gone from both namespaces.
func TestEnsureRollsBack(t *testing.T) {
	agent, sidecar := netnstest.New(t, "veth"), netnstest.New(t, "veth")
	rule := netlink.NewRule()
	rule.Dst = &net.IPNet{IP: net.ParseIP("169.254.77.2").To4(), Mask: net.CIDRMask(32, 32)}
	rule.Type = unix.FR_ACT_PROHIBIT
	if err := handle(t, agent).RuleAdd(rule); err != nil {
		t.Fatal(err)
	}
	err := vethlink.Ensure(agent.Handle, sidecar.Handle, spec)
	if err == nil || !strings.Contains(err.Error(), "replace default route with via 169.254.77.2 dev ce-a0") {
		t.Fatalf("Ensure = %v, want the route step's error", err)
	}
	for _, side := range []struct {
		ns   netnstest.NS
		name string
	}{{agent, spec.AgentName}, {sidecar, spec.SidecarName}} {
		if _, err := handle(t, side.ns).LinkByName(side.name); err == nil {
			t.Errorf("link %s still in %s after a failed Ensure", side.name, side.ns.Name)
		}
	}
}

func TestEnsureLeavesForeignLinkAlone(t *testing.T) {
	agent, sidecar := netnstest.New(t, "veth"), netnstest.New(t, "veth")
	if err := handle(t, sidecar).LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: spec.SidecarName}}); err != nil {
		t.Fatal(err)
	}
	err := vethlink.Ensure(agent.Handle, sidecar.Handle, spec)
	if err == nil || !strings.Contains(err.Error(), "already has a link ce-s0") {
		t.Fatalf("Ensure = %v, want a refusal naming the foreign link", err)
	}
	if err := vethlink.Remove(agent.Handle, sidecar.Handle, spec); err == nil || !strings.Contains(err.Error(), "not a veth") {
		t.Fatalf("Remove = %v, want a refusal to delete the bridge", err)
	}
	if _, err := handle(t, sidecar).LinkByName(spec.SidecarName); err != nil {
		t.Fatalf("the foreign link is gone: %v", err)
	}
}

func TestRemove(t *testing.T) {
	agent, sidecar := netnstest.New(t, "veth"), netnstest.New(t, "veth")
	if err := vethlink.Ensure(agent.Handle, sidecar.Handle, spec); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := vethlink.Remove(agent.Handle, sidecar.Handle, spec); err != nil {
			t.Fatalf("Remove #%d: %v", i+1, err)
		}
	}
	for _, side := range []struct {
		ns   netnstest.NS
		name string
	}{{agent, spec.AgentName}, {sidecar, spec.SidecarName}} {
		if _, err := handle(t, side.ns).LinkByName(side.name); err == nil {
			t.Errorf("link %s still in %s after Remove", side.name, side.ns.Name)
		}
	}
	if p := mustCheck(t, agent, sidecar); !has(p, "has no default route via") {
		t.Fatalf("Check after Remove = %q, want the missing default route", p)
	}
}
