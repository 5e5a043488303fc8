package docker

import (
	"context"
	"reflect"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

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
			if tc.to.Restricted() {
				if routes := r.agentRoutes(t, e); len(routes) != 0 {
					t.Errorf("agent default routes %v, want none", routes)
				}
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
