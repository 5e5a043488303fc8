package dockerenv

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/net/egresslink"
	"github.com/compass-egress/compass-egress/net/nftredirect"
	"github.com/compass-egress/compass-egress/net/nsthread"
	"github.com/compass-egress/compass-egress/policy"
)

// The transparent path's wiring on the real engine, read from the host: allowlist has
// the link, its routes and the table; public has none of them; allowlist again has them
// back; a TCP connection from the agent to the fake internet never reaches it and UDP
// out is counted as dropped; close leaves nothing.
func TestTransparentWiring(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 4*time.Minute)
	p := h.Provider(t)
	e := h.Open(t, p, "transparent", allowlist)
	spec := e.TransparentLink()
	assertLinked(t, ctx, e, spec, true)
	assertOutsideSeesNothing(t, ctx, e)

	for _, step := range []struct {
		pol    policy.Policy
		linked bool
	}{{policy.Public, false}, {allowlist, true}} {
		rep, err := e.Switch(ctx, step.pol, controller.PhaseLabel{Phase: "run"})
		if err != nil {
			t.Fatalf("switch to %s: %v", step.pol.Mode, err)
		}
		t.Logf("switch to %s: %v parts %v changes %q", step.pol.Mode, rep.Duration, rep.Parts, rep.Changes)
		if step.pol.Mode == policy.ModePublic && rep.PreviousDropped["udp"].Packets == 0 {
			t.Errorf("switch to public: previous dropped %v, want the allowlist phase's UDP", rep.PreviousDropped)
		}
		assertLinked(t, ctx, e, spec, step.linked)
	}
	st, err := e.Status(ctx)
	if err != nil || !st.OK {
		t.Fatalf("status after allowlist again: %v %+v", err, st.Problems)
	}

	agentPID, sidecarPID := pids(t, ctx, e)
	if err := e.Close(ctx, false); err != nil {
		t.Fatalf("close: %v", err)
	}
	for _, pid := range []int{agentPID, sidecarPID} {
		if ns, err := netns.GetFromPid(pid); err == nil {
			ns.Close()
			t.Errorf("pid %d (a container of the closed environment) still has a namespace", pid)
		}
	}
}

func pids(t *testing.T, ctx context.Context, e *docker.Env) (agent, sidecar int) {
	t.Helper()
	for _, c := range []struct {
		ref string
		pid *int
	}{{e.AgentContainer(), &agent}, {e.SidecarContainer(), &sidecar}} {
		ci, err := h.Docker.ContainerInspect(ctx, c.ref)
		if err != nil || ci.State == nil || ci.State.Pid == 0 {
			t.Fatalf("inspect %s: %v", c.ref, err)
		}
		*c.pid = ci.State.Pid
	}
	return agent, sidecar
}

// assertLinked reads the agent's routes and links and the sidecar's table from the host.
func assertLinked(t *testing.T, ctx context.Context, e *docker.Env, spec egresslink.Spec, linked bool) {
	t.Helper()
	agentPID, sidecarPID := pids(t, ctx, e)
	routes, err := h.DefaultRoutes(ctx, e.AgentContainer())
	if err != nil {
		t.Fatal(err)
	}
	viaLink := "default via " + spec.Gateway().String()
	if linked != slices.Equal(routes, []string{viaLink}) {
		t.Errorf("linked=%t: agent default routes %v (want exactly %q when linked)", linked, routes, viaLink)
	}
	ns, err := netns.GetFromPid(agentPID)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	l, lerr := nh.LinkByName(spec.Link.AgentName)
	if (lerr == nil) != linked {
		t.Errorf("linked=%t: agent link %s: %v", linked, spec.Link.AgentName, lerr)
	}
	if linked && lerr == nil {
		dst := netip.PrefixFrom(e.SidecarAddr(), 32)
		rs, err := nh.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(32, 32)}}, netlink.RT_FILTER_DST)
		if err != nil || len(rs) != 1 || rs[0].LinkIndex != l.Attrs().Index || !rs[0].Gw.Equal(spec.Gateway().AsSlice()) {
			t.Errorf("agent route to the sidecar %v: %v, %v; want one via %v dev %s", dst, rs, err, spec.Gateway(), spec.Link.AgentName)
		}
	}
	sns, err := netns.GetFromPid(sidecarPID)
	if err != nil {
		t.Fatal(err)
	}
	defer sns.Close()
	problems, err := nftredirect.Check(sns, spec.Table)
	if err != nil {
		t.Fatal(err)
	}
	if linked && len(problems) > 0 {
		t.Errorf("sidecar table: %q", problems)
	}
	if !linked && (len(problems) != 1 || problems[0] != "table inet compass_transparent is missing") {
		t.Errorf("public: sidecar table problems %q, want only that it is missing", problems)
	}
}

// assertOutsideSeesNothing dials the fake internet from inside the agent: TCP must not
// reach a listener in the fake internet's namespace, and UDP must be counted dropped.
func assertOutsideSeesNothing(t *testing.T, ctx context.Context, e *docker.Env) {
	t.Helper()
	fci, err := h.Docker.ContainerInspect(ctx, h.Prefix+"-fakenet")
	if err != nil {
		t.Fatal(err)
	}
	outside, err := netns.GetFromPid(fci.State.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer outside.Close()
	var ln net.Listener
	if err := nsthread.Run(outside, func() (err error) { ln, err = net.Listen("tcp4", ":0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	agentPID, sidecarPID := pids(t, ctx, e)
	agent, err := netns.GetFromPid(agentPID)
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	dst := netip.AddrPortFrom(h.Fakenet, uint16(port)).String()
	err = nsthread.Run(agent, func() error {
		if c, err := net.DialTimeout("tcp4", dst, 2*time.Second); err == nil {
			c.Close()
		}
		c, err := net.Dial("udp4", dst)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("quic"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-accepted:
		t.Errorf("a TCP connection from the agent reached the fake internet at %s", dst)
	case <-time.After(time.Second):
	}
	sidecar, err := netns.GetFromPid(sidecarPID)
	if err != nil {
		t.Fatal(err)
	}
	defer sidecar.Close()
	counts, err := nftredirect.Counters(sidecar, "")
	if err != nil || counts[nftredirect.ClassUDP].Packets == 0 {
		t.Errorf("sidecar drop counters %v, %v; want the agent's UDP counted", counts, err)
	}
}
