package docker

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy"
)

// agentNetworks lists, sorted, the networks the agent is connected to.
func (r *rig) agentNetworks(t *testing.T, e *Env) []string {
	t.Helper()
	ci, err := r.docker.ContainerInspect(context.Background(), e.AgentContainer())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for n := range ci.NetworkSettings.Networks {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// connectStray puts the agent on a non-internal network the environment does not manage.
func (r *rig) connectStray(t *testing.T, e *Env, net string) {
	t.Helper()
	ctx := context.Background()
	if _, err := r.docker.NetworkCreate(ctx, net, network.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := r.docker.NetworkConnect(ctx, net, e.AgentContainer(), &network.EndpointSettings{}); err != nil {
		t.Fatal(err)
	}
}

// A switch leaves the agent on no network the mode does not name, whatever other
// network it was put on, and a failed switch leaves it on the task network alone.
func TestSwitchDetachesAgentFromStrayNetworks(t *testing.T) {
	tests := []struct {
		name string
		to   policy.Policy
		fail bool
		want func(e *Env) []string
	}{
		{"allowlist", allowA, false, func(e *Env) []string { return []string{e.Network()} }},
		{"no-network", policy.NoNetwork, false, func(e *Env) []string { return []string{e.Network()} }},
		{"public", policy.Public, false, func(e *Env) []string { return []string{e.Network(), "test-egress"} }},
		{"failed switch", allowA, true, func(e *Env) []string { return []string{e.Network()} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, "t6")
			e := r.open(t, "t6", policy.Public)
			r.connectStray(t, e, "bridge")
			r.admin.mu.Lock()
			r.admin.fail = tc.fail
			r.admin.mu.Unlock()
			tr, err := e.Apply(context.Background(), tc.to, controller.PhaseLabel{Phase: "run"})
			if tc.fail != (err != nil) || tr.OK == tc.fail {
				t.Fatalf("switch: ok=%t err=%v, want failure %t", tr.OK, err, tc.fail)
			}
			if got, want := r.agentNetworks(t, e), tc.want(e); !reflect.DeepEqual(got, want) {
				t.Errorf("agent networks %v, want %v", got, want)
			}
			// A failed switch leaves no default route at all, not even the link's.
			switch routes := r.agentRoutes(t, e); {
			case tc.fail && len(routes) != 0:
				t.Errorf("agent default routes %v after a failed switch, want none", routes)
			case !tc.fail && tc.to.Restricted() && !slices.Equal(routes, []netip.Addr{e.link.Gateway()}):
				t.Errorf("agent default routes %v, want only the transparent link's %v", routes, e.link.Gateway())
			}
		})
	}
}

// A process configured with another egress network still cuts the one the environment
// was opened with.
func TestLookupUsesOpenedEgressNetwork(t *testing.T) {
	r := newRig(t, "t7")
	e := r.open(t, "t7", policy.Public)
	other, err := New(r.docker, Config{StateDir: r.p.cfg.StateDir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if other.cfg.EgressNetwork == "test-egress" {
		t.Fatalf("the default egress network is %q, the test needs another", other.cfg.EgressNetwork)
	}
	other.routes = r.routes
	other.link = r.link
	ctx := context.Background()
	looked, err := other.Lookup(ctx, "t7")
	if err != nil {
		t.Fatal(err)
	}
	if looked.egressNet != "test-egress" {
		t.Errorf("lookup egress network %q, want test-egress", looked.egressNet)
	}
	for _, to := range []policy.Policy{policy.NoNetwork, policy.Public, allowA} {
		tr, err := looked.Apply(ctx, to, controller.PhaseLabel{Phase: "run"})
		if err != nil || !tr.OK {
			t.Fatalf("switch to %s: %v", to.Mode, err)
		}
		want := []string{e.Network()}
		if !to.Restricted() {
			want = append(want, "test-egress")
		}
		if got := r.agentNetworks(t, e); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: agent networks %v, want %v", to.Mode, got, want)
		}
	}
	if st, err := looked.Status(ctx); err != nil || !st.OK {
		t.Errorf("status: %v %v", err, st.Problems)
	}
}

// A sidecar created before the egress-network label names its network by its mode.
func TestLookupLegacySidecarWithoutEgressLabel(t *testing.T) {
	r := newRig(t, "t8")
	r.open(t, "t8", policy.NoNetwork)
	r.docker.mu.Lock()
	delete(r.docker.containers["compass-proxy-t8"].labels, labelEgressNet)
	r.docker.mu.Unlock()
	other, err := New(r.docker, Config{StateDir: r.p.cfg.StateDir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	looked, err := other.Lookup(context.Background(), "t8")
	if err != nil {
		t.Fatal(err)
	}
	if looked.egressNet != "test-egress" {
		t.Errorf("lookup egress network %q, want test-egress", looked.egressNet)
	}
}

// restartingDocker restarts the agent (a new pid) right after the agent's first
// network connect or disconnect once armed, as a crash-and-restart mid-switch would.
type restartingDocker struct {
	*fakeDocker
	agent string
	armed atomic.Bool
}

func (d *restartingDocker) restart(ctx context.Context, ref string) error {
	if ref != d.agent || !d.armed.CompareAndSwap(true, false) {
		return nil
	}
	return d.fakeDocker.ContainerStart(ctx, ref, container.StartOptions{})
}

func (d *restartingDocker) NetworkConnect(ctx context.Context, net, ref string, es *network.EndpointSettings) error {
	if err := d.fakeDocker.NetworkConnect(ctx, net, ref, es); err != nil {
		return err
	}
	return d.restart(ctx, ref)
}

func (d *restartingDocker) NetworkDisconnect(ctx context.Context, net, ref string, force bool) error {
	if err := d.fakeDocker.NetworkDisconnect(ctx, net, ref, force); err != nil {
		return err
	}
	return d.restart(ctx, ref)
}

// An agent restarted during a switch fails it closed: its routes are never edited
// through the pid it had when the switch began.
func TestSwitchRefusesRestartedAgent(t *testing.T) {
	tests := []struct {
		name     string
		from, to policy.Policy
	}{
		{"restricting", policy.Public, allowA},
		{"widening", policy.NoNetwork, policy.Public},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, "t9")
			e := r.open(t, "t9", tc.from)
			d := &restartingDocker{fakeDocker: r.docker, agent: e.AgentContainer()}
			d.armed.Store(true)
			r.p.api = d
			tr, err := e.Apply(context.Background(), tc.to, controller.PhaseLabel{Phase: "run"})
			if err == nil || tr.OK || !strings.Contains(err.Error(), "restarted during the switch") {
				t.Fatalf("switch: ok=%t err=%v, want a failure naming the restart", tr.OK, err)
			}
			if d.armed.Load() {
				t.Fatal("the agent was never restarted")
			}
			if routes := r.agentRoutes(t, e); len(routes) != 0 {
				t.Errorf("restarted agent has default routes %v, want none", routes)
			}
			if got, want := r.agentNetworks(t, e), []string{e.Network()}; !reflect.DeepEqual(got, want) {
				t.Errorf("agent networks %v, want %v", got, want)
			}
		})
	}
}

// A switch or an open waiting for another controller's lock gives up when its context
// ends: the runner bounds the switch that restores the baseline after evaluate, and a
// controller stuck elsewhere (a hung engine call under `switch`) must not hold it for ever.
// The open that gives up has changed nothing; the switch, like any failed switch, leaves
// the agent with no egress.
func TestLocksHonourTheContext(t *testing.T) {
	for _, tc := range []struct {
		name string
		lock func(r *rig) string // the lock file another controller holds
		call func(r *rig, e *Env, ctx context.Context) error
	}{
		{"switch", func(r *rig) string { return filepath.Join(r.p.cfg.StateDir, "t9", "lock") },
			func(_ *rig, e *Env, ctx context.Context) error {
				_, err := e.Apply(ctx, allowA, controller.PhaseLabel{Phase: "run"})
				return err
			}},
		{"open", func(r *rig) string { return filepath.Join(r.p.cfg.StateDir, ".open-locks", "t9") },
			func(r *rig, _ *Env, ctx context.Context) error {
				_, err := r.p.OpenEnv(ctx, controller.EnvSpec{Task: "t9", Image: "agent:1", Baseline: policy.NoNetwork, ProxyStartTimeout: time.Second})
				return err
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, "t9")
			var e *Env
			if tc.name == "switch" {
				e = r.open(t, "t9", policy.Public)
			}
			if err := os.MkdirAll(filepath.Dir(tc.lock(r)), 0o750); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(tc.lock(r), os.O_CREATE|os.O_RDWR, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
				t.Fatal(err)
			}
			events := len(r.ev.all())
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- tc.call(r, e, ctx) }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), context.DeadlineExceeded.Error()) {
					t.Errorf("%s behind a held lock: %v, want the context's deadline", tc.name, err)
				}
			case <-time.After(30 * time.Second): // a hang guard: the context ends after 100 ms
				t.Errorf("%s behind a held lock ignored its context", tc.name)
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				<-done
			}
			if e == nil {
				if got := r.ev.all()[events:]; len(got) != 0 {
					t.Errorf("open that never got the lock changed things: %v", got)
				}
				return
			}
			r.admin.mu.Lock()
			mode := r.admin.current.Mode
			r.admin.mu.Unlock()
			if nets := r.agentNetworks(t, e); mode != policy.ModeNoNetwork || slices.Contains(nets, "test-egress") || len(r.agentRoutes(t, e)) != 0 {
				t.Errorf("after a switch that never got the lock: sidecar %s, agent on %v with routes %v; want no egress", mode, nets, r.agentRoutes(t, e))
			}
		})
	}
}

// A phase label the sidecar would refuse is refused before the switch touches anything:
// found at the sidecar, after a restricting switch has cut the wiring, it would fail
// closed and take the policy in force with it.
func TestSwitchRefusesBadPhaseLabelFirst(t *testing.T) {
	for _, tc := range []struct{ name, phase string }{
		{"too long", strings.Repeat("p", 129)},
		{"control character", "run\nphase"},
		{"not UTF-8", "run\xff"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, "t13")
			e := r.open(t, "t13", allowA)
			events := len(r.ev.all())
			deny := policy.Policy{Mode: policy.ModeDenylist, Targets: []policy.Target{mustTarget("b.test")}}
			_, err := e.Apply(context.Background(), deny, controller.PhaseLabel{Phase: tc.phase})
			if err == nil || !strings.Contains(err.Error(), "phase label") {
				t.Errorf("switch with phase label %q: %v, want an error naming the phase label", tc.phase, err)
			}
			if got := r.ev.all()[events:]; len(got) != 0 {
				t.Errorf("a refused switch changed things: %v", got)
			}
			in, _, _ := e.dir.readIntent()
			if in.Digest != allowA.Digest() {
				t.Errorf("intent now %s, want the allowlist still intended", in.Policy)
			}
		})
	}
}

// A network the agent cannot be taken off does not keep it on the others: the egress
// network goes whatever a stray network (sorted before it) answers, in the switch and in
// its fail-closed steps.
func TestDetachGoesOnPastAStuckNetwork(t *testing.T) {
	r := newRig(t, "t14")
	e := r.open(t, "t14", policy.Public)
	r.connectStray(t, e, "aaa-stray")
	r.docker.mu.Lock()
	r.docker.disconnectErr = map[string]error{"aaa-stray": errors.New("driver failed")}
	r.docker.mu.Unlock()

	_, err := e.Apply(context.Background(), policy.NoNetwork, controller.PhaseLabel{Phase: "run"})
	if err == nil || !strings.Contains(err.Error(), "aaa-stray") {
		t.Errorf("switch: %v, want it to fail naming the stuck network", err)
	}
	if nets := r.agentNetworks(t, e); slices.Contains(nets, "test-egress") {
		t.Errorf("agent still on %v after a failed restricting switch, want it off test-egress", nets)
	}
}

// Fail-closed steps it could not take make the error say so: an agent it could not
// inspect for its routes is not reported as left with no egress.
func TestFailClosedReportsSkippedRouteRemoval(t *testing.T) {
	r := newRig(t, "t15")
	e := r.open(t, "t15", policy.Public)
	r.admin.mu.Lock()
	r.admin.fail = true
	r.admin.mu.Unlock()
	// The second agent inspect after the refused PUT is fail-closed's look for the pid.
	seen := 0
	r.docker.mu.Lock()
	r.docker.inspectErr = func(ref string) error {
		if ref != e.AgentContainer() || r.ev.index("admin-put-refused") < 0 {
			return nil
		}
		if seen++; seen == 2 {
			return errors.New("engine hiccup")
		}
		return nil
	}
	r.docker.mu.Unlock()

	_, err := e.Apply(context.Background(), allowA, controller.PhaseLabel{Phase: "run"})
	if err == nil || !strings.Contains(err.Error(), "FAIL-CLOSED INCOMPLETE") || !strings.Contains(err.Error(), "engine hiccup") {
		t.Errorf("switch: %v, want FAIL-CLOSED INCOMPLETE with the inspect error", err)
	}
}

// status under public reports a default route besides the one via the egress gateway:
// the docs promise exactly one, and a second one is a way out nobody decided on.
func TestStatusPublicFlagsExtraDefaultRoutes(t *testing.T) {
	r := newRig(t, "t16")
	e := r.open(t, "t16", policy.Public)
	ctx := context.Background()
	if st, err := e.Status(ctx); err != nil || !st.OK {
		t.Fatalf("status after open: %v %v", err, st.Problems)
	}
	ci, err := r.docker.ContainerInspect(ctx, e.AgentContainer())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.routes.AddDefaultRoute(ci.State.Pid, netip.MustParseAddr("fe80::1")); err != nil {
		t.Fatal(err)
	}
	st, err := e.Status(ctx)
	if err != nil || st.OK || !strings.Contains(strings.Join(st.Problems, "\n"), "fe80::1") {
		t.Errorf("status with a second default route: ok=%t %v %v, want a problem naming it", st.OK, err, st.Problems)
	}
}

// A switch whose transition cannot be recorded returns an error, which every caller takes
// for "no egress" (the runner records no-network and may retain the environment so): the
// environment must then have none, not the new policy's egress.
func TestUnrecordedSwitchFailsClosed(t *testing.T) {
	r := newRig(t, "t17")
	e := r.open(t, "t17", policy.NoNetwork)
	// A directory where transitions.jsonl goes makes the append fail (as a full disk would).
	if err := os.Remove(e.dir.transitions()); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(e.dir.transitions(), 0o700); err != nil {
		t.Fatal(err)
	}
	tr, err := e.Apply(context.Background(), policy.Public, controller.PhaseLabel{Phase: "run"})
	if err == nil || tr.OK {
		t.Fatalf("switch with no transition log: ok=%t err=%v, want a failure", tr.OK, err)
	}
	r.admin.mu.Lock()
	mode := r.admin.current.Mode
	r.admin.mu.Unlock()
	if nets := r.agentNetworks(t, e); mode != policy.ModeNoNetwork || slices.Contains(nets, "test-egress") || len(r.agentRoutes(t, e)) != 0 {
		t.Errorf("after an unrecorded switch: sidecar %s, agent on %v, routes %v; want no egress", mode, nets, r.agentRoutes(t, e))
	}
}
