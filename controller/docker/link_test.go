package docker

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy"
)

func (r *rig) sidecarPID(t *testing.T, e *Env) int {
	t.Helper()
	ci, err := r.docker.ContainerInspect(context.Background(), e.SidecarContainer())
	if err != nil {
		t.Fatal(err)
	}
	return ci.State.Pid
}

// Restricted: Docker's routes go, then the table, then the link, then the new rules;
// public: the rules, then the link and table go, then the agent is connected.
func TestSwitchOrdersTheTransparentPath(t *testing.T) {
	r := newRig(t, "tl")
	e := r.open(t, "tl", policy.Public)
	r.ev.reset()
	rep, err := e.Switch(context.Background(), allowA, controller.PhaseLabel{Phase: "run"})
	if err != nil {
		t.Fatal(err)
	}
	r.inOrder(t, "admin-put no-network", "disconnect", "routes-remove", "table-ensure", "link-ensure", "admin-put allowlist")
	if !slices.ContainsFunc(rep.Changes, func(c string) bool { return strings.HasPrefix(c, "transparent link "+e.link.String()+" ensured") }) {
		t.Errorf("changes %q name no transparent link", rep.Changes)
	}
	if _, ok := rep.Parts[partLink]; !ok {
		t.Errorf("parts %v: no %s", rep.Parts, partLink)
	}
	r.link.drop(r.sidecarPID(t, e), 3)
	r.ev.reset()
	rep, err = e.Switch(context.Background(), policy.Public, controller.PhaseLabel{Phase: "free"})
	if err != nil {
		t.Fatal(err)
	}
	r.inOrder(t, "admin-put public", "counters-take", "link-remove", "connect "+e.AgentContainer()+" test-egress")
	if got := rep.PreviousDropped["udp"].Packets; got != 3 {
		t.Errorf("public switch: previous dropped %v, want the allowlist phase's 3 udp packets", rep.PreviousDropped)
	}
	if routes := r.agentRoutes(t, e); len(routes) != 1 || linkLocal.Contains(routes[0]) {
		t.Errorf("public: agent routes %v, want Docker's one", routes)
	}
}

// Each restricted phase's drops are its own: a switch takes and zeroes them.
func TestSwitchTakesEachPhasesDrops(t *testing.T) {
	r := newRig(t, "td")
	e := r.open(t, "td", allowA)
	r.link.drop(r.sidecarPID(t, e), 2)
	rep, err := e.Switch(context.Background(), policy.NoNetwork, controller.PhaseLabel{Phase: "quiet"})
	if err != nil || rep.PreviousDropped["udp"].Packets != 2 {
		t.Fatalf("switch: %v, previous dropped %v; want 2 udp packets", err, rep.PreviousDropped)
	}
	trs, err := e.dir.lastTransitions(1)
	if err != nil || len(trs) != 1 || trs[0].PreviousDropped["udp"].Packets != 2 {
		t.Fatalf("recorded transition %+v, %v: want the drops", trs, err)
	}
	rep, err = e.Switch(context.Background(), allowA, controller.PhaseLabel{Phase: "run"})
	if err != nil || rep.PreviousDropped["udp"].Packets != 0 {
		t.Fatalf("next switch: %v, previous dropped %v; want none", err, rep.PreviousDropped)
	}
}

// A failure at any transparent-path step leaves the agent with no default route at
// all, and the failure recorded.
func TestSwitchLinkFailureFailsClosed(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		fail func(l *fakeLink)
		to   policy.Policy
	}{
		{"ensure", func(l *fakeLink) { l.ensureErr = boom }, allowA},
		{"check", func(l *fakeLink) { l.problems = []string{"link ce-a0 is down"} }, allowA},
		{"take counters", func(l *fakeLink) { l.takeErr = boom }, policy.NoNetwork},
		{"remove", func(l *fakeLink) { l.removeErr = boom }, policy.Public},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, "tf")
			e := r.open(t, "tf", allowA)
			r.link.mu.Lock()
			tc.fail(r.link)
			r.link.mu.Unlock()
			rep, err := e.Switch(context.Background(), tc.to, controller.PhaseLabel{Phase: "run"})
			if err == nil || rep.OK || !strings.Contains(err.Error(), "transparent path") {
				t.Fatalf("switch: ok=%t err=%v, want a failure naming the transparent path", rep.OK, err)
			}
			if routes := r.agentRoutes(t, e); len(routes) != 0 {
				t.Errorf("after the failure the agent has default routes %v, want none", routes)
			}
			if slices.Contains(r.agentNetworks(t, e), "test-egress") {
				t.Error("after the failure the agent is on the egress network")
			}
		})
	}
}

// Environments get distinct slots (their task subnets are distinct: Docker refuses an
// overlap, however many open at once), kept in the state directory: a process
// configured with another pool finds the same link.
func TestLinkSlotsAreUniqueAndPersisted(t *testing.T) {
	r := newRig(t, "u0")
	const n = 6
	envs := make([]*Env, n)
	for i := range envs {
		task := fmt.Sprintf("u%d", i)
		if i > 0 {
			startFakeAdmin(t, stateDir(filepath.Join(r.p.cfg.StateDir, task)).socket(), r.ev)
		}
		envs[i] = r.open(t, task, policy.NoNetwork)
	}
	seen := map[string]bool{}
	for _, e := range envs {
		if seen[e.link.String()] {
			t.Errorf("two environments share link %s", e.link)
		}
		seen[e.link.String()] = true
	}
	other, err := New(r.docker, Config{StateDir: r.p.cfg.StateDir, EgressNetwork: "test-egress", Pool: netip.MustParsePrefix("10.99.0.0/16")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	looked, err := other.Lookup(context.Background(), envs[0].ID())
	if err != nil {
		t.Fatal(err)
	}
	if looked.link.String() != envs[0].link.String() {
		t.Errorf("another pool's process sees link %s, want the recorded %s", looked.link, envs[0].link)
	}
	if _, err := os.Stat(filepath.Join(envs[0].StateDir(), "link.json")); err != nil {
		t.Error(err)
	}
}

// A pool with more subnets than link addresses is refused before anything is made.
func TestConfigRefusesAPoolWiderThanTheLinks(t *testing.T) {
	_, err := New(nil, Config{StateDir: t.TempDir(), Pool: netip.MustParsePrefix("10.0.0.0/12"), SubnetBits: 28}, nil)
	if err == nil || !strings.Contains(err.Error(), "transparent links") {
		t.Fatalf("New = %v, want a refusal of the pool", err)
	}
}

// Status shows the path, its problems and its counters.
func TestStatusReportsTheTransparentPath(t *testing.T) {
	r := newRig(t, "ts")
	e := r.open(t, "ts", allowA)
	r.link.drop(r.sidecarPID(t, e), 5)
	st, err := e.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !st.OK || st.Transparent.Link != e.link.String() || st.Transparent.Dropped["udp"].Packets != 5 || len(st.Transparent.Problems) != 0 {
		t.Fatalf("status ok=%t %v transparent %+v; want ok with the link and 5 udp drops", st.OK, st.Problems, st.Transparent)
	}
	r.link.mu.Lock()
	r.link.problems = []string{"link ce-s1 in sidecar namespace is down"}
	r.link.mu.Unlock()
	st, err = e.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.OK || !slices.Contains(st.Problems, "transparent path: link ce-s1 in sidecar namespace is down") {
		t.Fatalf("status ok=%t %v; want the link's problem", st.OK, st.Problems)
	}
}
