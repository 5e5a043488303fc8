package dockerenv

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/e2e/harness"
	"github.com/compass-egress/compass-egress/policy"
)

// An attached container keeps Docker's default NET_RAW, with which it can write any
// source address into a packet. A DNS query to the sidecar "from" a host outside would
// have the sidecar's refusal, which echoes the query's name, carry that name out through
// the egress network: a channel even under no-network. Two layers stop it. On this
// engine (br_netfilter on) Docker's rule for an internal network, "! -s <subnet> -o
// <bridge> -j DROP", drops the packet on the bridge; without the second layer the query
// still never arrives here. The second, for engines that do not filter bridged traffic,
// is the sidecar's strict reverse-path filter (the query's source does not route back
// through the task network), which the engine applied if the running sidecar carries
// it. Under no-network the container's packets to the sidecar go over the transparent
// link, whose table drops any source but the link's agent end (the spoofed counter): the
// same hand-built query from that address is the control: it must reach the sidecar and
// be refused. (The container's task-network address, the control before the link, is
// now dropped as spoofed too.)
func TestSidecarDropsSpoofedQueries(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 3*time.Minute)
	p := h.Provider(t)
	ctr := h.ProbeContainer(ctx, t, "spoofer", &container.HostConfig{NetworkMode: "bridge"}, true)
	e, err := p.Attach(ctx, controller.EnvSpec{Task: h.Name("spoof"), Baseline: policy.NoNetwork}, ctr)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background(), false) })
	ci, err := h.Docker.ContainerInspect(ctx, ctr)
	if err != nil {
		t.Fatal(err)
	}
	if ci.NetworkSettings.Networks[e.Network()] == nil {
		t.Fatalf("the container is not on %s", e.Network())
	}
	own := e.TransparentLink().Link.AgentAddr.Addr()
	sc, err := h.Docker.ContainerInspect(ctx, e.SidecarContainer())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter"} {
		if v := sc.HostConfig.Sysctls[k]; v != "1" {
			t.Errorf("the sidecar runs with %s=%q, want 1 (strict)", k, v)
		}
	}
	dst := netip.AddrPortFrom(e.SidecarAddr(), 53).String()
	spoofedName, ownName := ctr+"-spoofed.test", ctr+"-own.test"
	// One exec each, spoofed first: by the time the control's refusal is counted, the
	// spoofed query, sent a whole exec earlier, would have been too.
	for _, c := range []harness.Check{
		{Name: "spoofed", Kind: "spoof", Target: dst, Source: netip.AddrPortFrom(h.Fakenet, 5353).String(), QName: spoofedName},
		{Name: "own", Kind: "spoof", Target: dst, Source: netip.AddrPortFrom(own, 5353).String(), QName: ownName},
	} {
		res, err := h.ExecProbe(ctx, ctr, []harness.Check{c})
		if err != nil {
			t.Fatalf("probe: %v", err)
		}
		if !res[c.Name].Reachable {
			t.Fatalf("%s query not sent: %s", c.Name, res[c.Name].Detail)
		}
	}
	blocked := func() []string {
		s, err := e.Blocked(ctx)
		if err != nil {
			t.Fatalf("blocked: %v", err)
		}
		var names []string
		for _, b := range s.Top {
			names = append(names, b.Host)
		}
		return names
	}
	var names []string
	for names = blocked(); !slices.Contains(names, ownName); names = blocked() {
		if ctx.Err() != nil {
			t.Fatalf("the control query from the container's own address was never refused (blocked: %v)", names)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if slices.Contains(names, spoofedName) {
		t.Errorf("the sidecar answered a query whose source (%s, the fake internet) it cannot route back to the task network: blocked %v", h.Fakenet, names)
	}
}
