package dockerenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"
	"github.com/vishvananda/netlink"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/e2e/harness"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// streamResult mirrors the probe's `stream` output.
type streamResult struct {
	Bytes        int    `json:"bytes"`
	FirstByteMS  int64  `json:"first_byte_unix_ms"`
	LastByteMS   int64  `json:"last_byte_unix_ms"`
	FirstSentMS  int64  `json:"first_sent_unix_ms"`
	LastSentMS   int64  `json:"last_sent_unix_ms"`
	EndedMS      int64  `json:"ended_unix_ms"`
	Error        string `json:"error"`
	ClosedByPeer bool   `json:"closed_by_peer"`
}

// waitAgentFile waits until path exists in the container (or ctx ends).
func waitAgentFile(t *testing.T, ctx context.Context, ctr, path string) {
	t.Helper()
	for {
		rc, _, err := h.Docker.CopyFromContainer(ctx, ctr, path)
		if err == nil {
			rc.Close()
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s never appeared in %s: %v", path, ctr, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// A connection opened under public (directly, and through the proxy) carries no line
// sent after the switch to no-network returned. fakenet stamps each line with its send
// time, so the check needs no guess of how long delivery or the probe take: a line read
// late but sent before the switch is fine, one sent after it must never arrive.
func TestConnectionDiesAtSwitchToNoNetwork(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 3*time.Minute)
	e := h.Open(t, h.Provider(t), "stream", policy.Public)
	proxy := netip.AddrPortFrom(e.SidecarAddr(), 3128).String()

	var wg sync.WaitGroup
	results := map[string]*streamResult{"direct": {}, "proxy": {}}
	errs := map[string]error{}
	var mu sync.Mutex
	for name, via := range map[string]string{"direct": "", "proxy": proxy} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The direct stream, cut without a close, reads until its SECONDS are up.
			out, err := h.Exec(ctx, e.AgentContainer(), "/probe", "stream", "http://stream.test/stream", via, "15", "/ready-"+name)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				err = json.Unmarshal(out, results[name])
			}
			errs[name] = err
		}()
	}
	for name := range results {
		waitAgentFile(t, ctx, e.AgentContainer(), "/ready-"+name) // its first line came
	}
	tr, err := e.Apply(ctx, policy.NoNetwork, controller.PhaseLabel{Phase: "run"})
	if err != nil {
		t.Fatalf("switch: %v", err)
	}
	switched := time.Now().UnixMilli()
	wg.Wait()
	for name, r := range results {
		if errs[name] != nil {
			t.Fatalf("%s stream: %v", name, errs[name])
		}
		if r.FirstSentMS == 0 || r.FirstSentMS >= switched {
			t.Fatalf("%s stream was not flowing before the switch: %+v", name, r)
		}
		if r.LastSentMS > switched {
			t.Errorf("%s stream received a line sent %d ms after the switch to no-network returned: %+v", name, r.LastSentMS-switched, r)
		}
	}
	if !results["proxy"].ClosedByPeer {
		t.Errorf("proxied stream was not closed by the proxy at the switch: %+v (switch closed %d connections)", results["proxy"], tr.Generation)
	}
}

// A dead sidecar leaves the agent with no egress; status says so; a switch repairs.
func TestSidecarKilledFailsClosed(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 3*time.Minute)
	e := h.Open(t, h.Provider(t), "killsc", allowlist)
	if err := h.Docker.ContainerKill(ctx, e.SidecarContainer(), "KILL"); err != nil {
		t.Fatalf("kill sidecar: %v", err)
	}
	proxy := netip.AddrPortFrom(e.SidecarAddr(), 3128).String()
	res, err := h.ExecProbe(ctx, e.AgentContainer(), []harness.Check{
		{Name: "allowed", Kind: "proxy", Target: "allowed.test:443", Proxy: proxy},
		// Without the proxy an allowed name: the transparent path leads to the dead sidecar.
		{Name: "direct", Kind: "tls", Target: netip.AddrPortFrom(h.Fakenet, 443).String(), Host: "allowed.test", TimeoutMS: 1500},
		{Name: "dns", Kind: "dns", Server: "127.0.0.11:53", QName: "allowed.test", TimeoutMS: 1500},
	})
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	for name, r := range res {
		if r.Reachable && (name != "dns" || r.Resolved) {
			t.Errorf("with the sidecar dead, %s still works: %s", name, r.Detail)
		}
	}
	statusReports(t, e, "sidecar is not running")
	repairAllowlist(t, e)
}

// compassctl killed in the middle of a restricting switch from public (after the agent
// was cut from the egress network, before the new rules): no egress at all, neither
// direct nor through the sidecar, which took no-network before the cut; status reports
// the mismatch, and a switch to the intended policy repairs.
func TestControllerKilledMidSwitch(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 3*time.Minute)
	task := h.Name("killctl")
	run := func(args ...string) (string, int) {
		cmd := h.Compassctl(ctx, args...)
		out, err := cmd.CombinedOutput()
		code := 0
		var ee interface{ ExitCode() int }
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("compassctl %v: %v", args, err)
		}
		return string(out), code
	}
	if out, code := run("env", "open", "--task", task, "--image", h.ProbeImage, "--policy", `"public"`); code != 0 {
		t.Fatalf("open: exit %d: %s", code, out)
	}
	t.Cleanup(func() { run("env", "close", "--task", task) })
	agent := "compass-agent-" + task

	sw := h.Compassctl(ctx, "env", "switch", "--task", task, "--policy", allowlist.String(), "--step-delay", "700ms")
	if err := sw.Start(); err != nil {
		t.Fatalf("start switch: %v", err)
	}
	// Kill as soon as the agent is off the egress network: the rules step is at least
	// two step delays away.
	for {
		nets, err := h.Networks(ctx, agent)
		if err != nil {
			t.Fatalf("inspect: %v", err)
		}
		if len(nets) == 1 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := sw.Process.Kill(); err != nil {
		t.Fatalf("kill compassctl: %v", err)
	}
	_ = sw.Wait()

	e, err := h.Provider(t).LookupTask(ctx, task, lifecycle.RoleAgent)
	if err != nil {
		t.Fatalf("lookup: %v", err)
	}
	proxy := netip.AddrPortFrom(e.SidecarAddr(), 3128).String()
	res, err := h.ExecProbe(ctx, agent, []harness.Check{
		// Without the proxy, by Host: the sidecar (no-network since the cut) must refuse it
		// if the transparent link is already there; without it there is no route at all.
		{Name: "direct", Kind: "http", Target: netip.AddrPortFrom(h.Fakenet, 80).String(), Host: "allowed.test", TimeoutMS: 1500},
		// public let this through the sidecar, and the allowlist refuses it.
		{Name: "proxied-blocked", Kind: "proxy", Target: "blocked.test:443", Proxy: proxy},
		{Name: "proxied-allowed", Kind: "proxy", Target: "allowed.test:443", Proxy: proxy},
	})
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	for name, r := range res {
		if r.Reachable {
			t.Errorf("after the kill the agent still has egress (%s): %s", name, r.Detail)
		}
	}
	out, code := run("env", "status", "--task", task, "--json")
	if code != 1 {
		t.Errorf("status after the kill: exit %d, want 1 (mismatch): %s", code, out)
	}
	var st docker.Status
	if err := json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &st); err != nil {
		t.Fatalf("status json: %v: %s", err, out)
	}
	if st.Sidecar.Mode != policy.ModeNoNetwork || st.Intended == nil || st.Intended.Mode != policy.ModeAllowlist {
		t.Errorf("status: sidecar %s intended %+v; want sidecar at the switch's no-network interim, allowlist intended", st.Sidecar.Mode, st.Intended)
	}

	if out, code := run("env", "switch", "--task", task, "--policy", allowlist.String()); code != 0 {
		t.Fatalf("repairing switch: exit %d: %s", code, out)
	}
	if out, code := run("env", "status", "--task", task); code != 0 {
		t.Errorf("status after repair: exit %d: %s", code, out)
	}
	if out, code := run("env", "verify", "--task", task, "--allowed", "allowed.test:443", "--blocked", "blocked.test:443", "--outside", h.Fakenet.String()); code != 0 {
		t.Errorf("verify after repair: exit %d: %s", code, out)
	}
	for i := 0; i < 2; i++ {
		if out, code := run("env", "close", "--task", task); code != 0 {
			t.Errorf("close #%d: exit %d: %s", i+1, code, out)
		}
	}
	left, err := h.Leftovers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range left {
		if strings.Contains(l, task) {
			t.Errorf("left behind after close: %s", l)
		}
	}
}

// attach refuses network modes that cannot be rewired, and moves a bridge container
// onto the task network.
func TestAttach(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 3*time.Minute)
	p := h.Provider(t)
	// A container tuned to ask for more than it may is created only: the refusal comes
	// before the running check, and this engine may not grant what it asks for.
	run := func(mode string, tune ...func(*container.HostConfig)) string {
		hc := &container.HostConfig{NetworkMode: container.NetworkMode(mode)}
		for _, f := range tune {
			f(hc)
		}
		return h.ProbeContainer(ctx, t, "victim", hc, len(tune) == 0)
	}
	bridge := run("bridge")
	for _, mode := range []string{"none", "host", "container:" + bridge} {
		victim := run(mode)
		_, err := p.Attach(ctx, controller.EnvSpec{Task: h.Name("attach"), Baseline: policy.NoNetwork}, victim)
		if !errors.Is(err, docker.ErrNotAttachable) || !strings.Contains(err.Error(), strings.SplitN(mode, ":", 2)[0]) {
			t.Errorf("attach of a %s container: err = %v, want ErrNotAttachable naming the mode", mode, err)
		}
	}
	// Containers that could put back what a switch removes (routes, addresses).
	for what, tune := range map[string]func(*container.HostConfig){
		"privileged": func(hc *container.HostConfig) { hc.Privileged = true },
		"NET_ADMIN":  func(hc *container.HostConfig) { hc.CapAdd = []string{"NET_ADMIN"} },
	} {
		victim := run("bridge", tune)
		_, err := p.Attach(ctx, controller.EnvSpec{Task: h.Name("attach"), Baseline: policy.NoNetwork}, victim)
		if !errors.Is(err, docker.ErrNotAttachable) || !strings.Contains(err.Error(), what) {
			t.Errorf("attach of a %s container: err = %v, want ErrNotAttachable naming it", what, err)
		}
	}
	left, err := h.Leftovers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range left {
		if strings.Contains(l, "-attach-") {
			t.Errorf("a refused attach left %s", l)
		}
	}

	e, err := p.Attach(ctx, controller.EnvSpec{Task: h.Name("attach"), Baseline: policy.NoNetwork}, bridge)
	if err != nil {
		t.Fatalf("attach bridge container: %v", err)
	}
	assertState(t, e, policy.ModeNoNetwork)
	if _, err := e.Apply(ctx, denylist, controller.PhaseLabel{Phase: "run"}); err != nil {
		t.Fatalf("switch: %v", err)
	}
	assertState(t, e, policy.ModeDenylist)
	if err := e.Close(ctx, false); err != nil {
		t.Fatalf("close: %v", err)
	}
	nets, err := h.Networks(ctx, bridge)
	if err != nil {
		t.Fatalf("attached container after close: %v", err)
	}
	if len(nets) != 0 {
		t.Errorf("attached container after close is on %v, want no network", nets)
	}
}

// Networks someone connected the agent to between phases (the egress network, a bridge
// of their own) are ways out past the sidecar: the next switch detaches the agent from
// them, and from inside it the fake internet is out of reach again.
func TestSwitchDetachesStrayNetworks(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 3*time.Minute)
	p := h.Provider(t)
	e := h.Open(t, p, "stray", allowlist)
	stray := h.Name("stray-net")
	if _, err := h.Docker.NetworkCreate(ctx, stray, network.CreateOptions{Driver: "bridge", Labels: map[string]string{harness.OwnerLabel: h.Owner}}); err != nil {
		t.Fatalf("create %s: %v", stray, err)
	}
	t.Cleanup(func() { _ = h.Docker.NetworkRemove(context.Background(), stray) })
	// Docker refuses to connect a network with a gateway to a container that has a
	// default route it did not set (the transparent link's: "file exists"); whoever
	// strays the agent has to remove it first.
	removeDefaultRoutes(t, e.AgentContainer())
	for _, n := range []string{h.EgressNetwork, stray} {
		if err := h.Docker.NetworkConnect(ctx, n, e.AgentContainer(), &network.EndpointSettings{}); err != nil {
			t.Fatalf("connect the agent to %s: %v", n, err)
		}
	}
	if _, err := e.Apply(ctx, denylist, controller.PhaseLabel{Phase: "run"}); err != nil {
		t.Fatalf("switch: %v", err)
	}
	assertState(t, e, policy.ModeDenylist)
}

// removeDefaultRoutes deletes ctr's IPv4 default routes from the host, as someone with
// root on it could.
func removeDefaultRoutes(t *testing.T, ctr string) {
	t.Helper()
	err := h.NetlinkIn(timeout(t, time.Minute), ctr, func(nh *netlink.Handle) error {
		rs, err := nh.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, r := range rs {
			if r.Dst == nil || r.Dst.IP.IsUnspecified() {
				if err := nh.RouteDel(&r); err != nil {
					return fmt.Errorf("delete %v: %w", r, err)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("remove the default routes of %s: %v", ctr, err)
	}
}
