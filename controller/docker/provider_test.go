package docker

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(runLockHolderEnv); dir != "" {
		os.Exit(holdRunLock(dir))
	}
	goleak.VerifyTestMain(m)
}

type rig struct {
	ev     *events
	docker *fakeDocker
	routes *fakeRoutes
	link   *fakeLink
	admin  *fakeAdmin
	p      *Provider
}

func newRig(t *testing.T, task string) *rig {
	t.Helper()
	ev := &events{}
	r := &rig{ev: ev, docker: newFakeDocker(ev), routes: &fakeRoutes{ev: ev, defaults: map[int][]netip.Addr{}}}
	r.docker.routes = r.routes
	r.docker.images[DefaultProxyImage] = true
	r.docker.images["agent:1"] = true
	p, err := New(r.docker, Config{StateDir: t.TempDir(), EgressNetwork: "test-egress"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.routes = r.routes
	r.link = newFakeLink(ev, r.routes)
	p.link = r.link
	r.p = p
	r.admin = startFakeAdmin(t, stateDir(filepath.Join(p.cfg.StateDir, task)).socket(), ev)
	return r
}

func (r *rig) open(t *testing.T, task string, baseline policy.Policy) *Env {
	t.Helper()
	e, err := r.p.OpenEnv(context.Background(), controller.EnvSpec{Task: task, Image: "agent:1", Baseline: baseline, ProxyStartTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return e
}

func (r *rig) agentRoutes(t *testing.T, e *Env) []netip.Addr {
	t.Helper()
	ci, err := r.docker.ContainerInspect(context.Background(), e.AgentContainer())
	if err != nil {
		t.Fatal(err)
	}
	got, _ := r.routes.DefaultRoutes(ci.State.Pid)
	return got
}

func (r *rig) before(t *testing.T, first, second string) {
	t.Helper()
	i, j := r.ev.index(first), r.ev.index(second)
	if i < 0 || j < 0 || i > j {
		t.Errorf("want %q before %q in %v", first, second, r.ev.all())
	}
}

var allowA = policy.Policy{Mode: policy.ModeAllowlist, Targets: []policy.Target{mustTarget("a.test")}}

func mustTarget(s string) policy.Target {
	t, err := policy.ParseTarget(s)
	if err != nil {
		panic(err)
	}
	return t
}

// inOrder checks that the events starting with each of prefixes happened, in that order,
// and that the sidecar got no other PUT.
func (r *rig) inOrder(t *testing.T, prefixes ...string) {
	t.Helper()
	evs := r.ev.all()
	puts, want := 0, 0
	next := 0
	for _, ev := range evs {
		if strings.HasPrefix(ev, "admin-put") {
			puts++
		}
		if next < len(prefixes) && strings.HasPrefix(ev, prefixes[next]) {
			next++
		}
	}
	for _, p := range prefixes {
		if strings.HasPrefix(p, "admin-put") {
			want++
		}
	}
	if next < len(prefixes) || puts != want {
		t.Errorf("want %q in this order, and %d PUTs, in %v", prefixes, want, evs)
	}
}

// The order of the switch steps keeps the agent within old ∪ new policy at every instant,
// and a restricting switch from public, once it has cut anything, within the new one.
func TestSwitchOrderNeverWidensEgress(t *testing.T) {
	r := newRig(t, "t1")
	e := r.open(t, "t1", policy.Public)
	agent := "compass-agent-t1"
	r.before(t, "admin-put public", "connect "+agent+" test-egress")
	if got := r.agentRoutes(t, e); len(got) != 1 || got[0] != netip.MustParseAddr("172.30.0.1") {
		t.Errorf("public: agent default routes %v, want one via the egress gateway", got)
	}

	cut := []string{"disconnect " + agent + " test-egress", "routes-remove"}
	tests := []struct {
		to    policy.Policy
		order []string
	}{
		{policy.NoNetwork, append([]string{"admin-put no-network"}, cut...)},
		{policy.Public, []string{"admin-put public", "connect " + agent + " test-egress"}},
		// The interim is labelled with the phase the switch ends, to which its blocked
		// attempts count.
		{allowA, append(append([]string{"admin-put no-network phase=test"}, cut...), "admin-put allowlist phase=run")},
		{policy.NoNetwork, []string{"admin-put no-network"}},
	}
	for i, tc := range tests {
		r.ev.log = nil
		label := controller.PhaseLabel{Phase: "test"}
		if i == 2 {
			label.Phase = "run"
		}
		tr, err := e.Apply(context.Background(), tc.to, label)
		if err != nil {
			t.Fatalf("switch to %s: %v", tc.to.Mode, err)
		}
		if !tr.OK || tr.ToMode != tc.to.Mode || tr.Digest != tc.to.Digest() || tr.Generation == 0 {
			t.Errorf("transition %+v", tr)
		}
		r.inOrder(t, tc.order...)
		routes := r.agentRoutes(t, e)
		if tc.to.Restricted() {
			if !slices.Equal(routes, []netip.Addr{e.link.Gateway()}) {
				t.Errorf("%s: agent default routes %v, want only the transparent link's %v", tc.to.Mode, routes, e.link.Gateway())
			}
		} else if len(routes) != 1 || linkLocal.Contains(routes[0]) {
			t.Errorf("public: routes %v", routes)
		}
	}
	trs, err := e.dir.lastTransitions(10)
	if err != nil || len(trs) != 5 {
		t.Fatalf("transitions.jsonl: %d records, %v", len(trs), err)
	}
	if trs[1].FromMode != policy.ModePublic || trs[1].ToMode != policy.ModeNoNetwork {
		t.Errorf("second transition %+v", trs[1])
	}
	st, err := e.Status(context.Background())
	if err != nil || !st.OK {
		t.Errorf("status: %v %+v", err, st.Problems)
	}
}

// A switch the sidecar refuses leaves no egress: agent cut, routes gone, and the sidecar
// (which refuses even no-network) cut from the egress network; a later switch repairs.
func TestFailedSwitchFailsClosed(t *testing.T) {
	r := newRig(t, "t2")
	e := r.open(t, "t2", policy.Public)
	r.admin.mu.Lock()
	r.admin.fail = true
	r.admin.mu.Unlock()

	rep, err := e.Switch(context.Background(), allowA, controller.PhaseLabel{Phase: "run"})
	if err == nil || !strings.Contains(err.Error(), "no egress") {
		t.Fatalf("switch error = %v, want one saying the agent was left with no egress", err)
	}
	if rep.OK || len(rep.FailClosed) == 0 {
		t.Errorf("report %+v", rep)
	}
	ctx := context.Background()
	agent, _ := r.docker.ContainerInspect(ctx, e.AgentContainer())
	sidecar, _ := r.docker.ContainerInspect(ctx, e.SidecarContainer())
	if connectedTo(agent, "test-egress") || connectedTo(sidecar, "test-egress") {
		t.Errorf("after a failed switch: agent on egress %t, sidecar on egress %t; want neither", connectedTo(agent, "test-egress"), connectedTo(sidecar, "test-egress"))
	}
	if routes := r.agentRoutes(t, e); len(routes) != 0 {
		t.Errorf("after a failed switch the agent has default routes %v", routes)
	}
	trs, _ := e.dir.lastTransitions(1)
	if len(trs) != 1 || trs[0].OK || trs[0].Error == "" {
		t.Errorf("failed transition not recorded: %+v", trs)
	}
	st, err := e.Status(ctx)
	if err != nil || st.OK {
		t.Errorf("status after a failed switch: OK=%t err=%v, want problems", st.OK, err)
	}

	r.admin.mu.Lock()
	r.admin.fail = false
	r.admin.mu.Unlock()
	rep, err = e.Switch(ctx, allowA, controller.PhaseLabel{Phase: "run"})
	if err != nil {
		t.Fatalf("repairing switch: %v", err)
	}
	if !strings.Contains(strings.Join(rep.Changes, "\n"), "sidecar reconnected") {
		t.Errorf("repair did not reconnect the sidecar: %v", rep.Changes)
	}
	if st, err := e.Status(ctx); err != nil || !st.OK {
		t.Errorf("status after repair: %v %v", err, st.Problems)
	}
}

// A failed open removes everything it created, and says why.
func TestOpenFailureCleansUp(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(r *rig)
		want    string
	}{
		{"proxy image missing", func(r *rig) { delete(r.docker.images, DefaultProxyImage) }, "image build"},
		{"agent image missing", func(r *rig) { delete(r.docker.images, "agent:1") }, "create agent"},
		{"sidecar never ready", func(r *rig) { _ = r.admin.srv.Close() }, "not ready within"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, "t3")
			tc.prepare(r)
			_, err := r.p.OpenEnv(context.Background(), controller.EnvSpec{Task: "t3", Image: "agent:1", Baseline: policy.NoNetwork, ProxyStartTimeout: 300 * time.Millisecond})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("open error = %v, want it to mention %q", err, tc.want)
			}
			if len(r.docker.containers) != 0 {
				t.Errorf("containers left: %v", r.docker.containers)
			}
			for name := range r.docker.networks {
				if name != "test-egress" {
					t.Errorf("network left: %s", name)
				}
			}
		})
	}
}

func TestCloseIsIdempotent(t *testing.T) {
	r := newRig(t, "t4")
	e := r.open(t, "t4", policy.NoNetwork)
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if err := e.Close(ctx, false); err != nil {
			t.Fatalf("close #%d: %v", i+1, err)
		}
	}
	if err := r.p.RemoveByName(ctx, "t4"); err != nil {
		t.Fatalf("remove by name after close: %v", err)
	}
	if len(r.docker.containers) != 0 || len(r.docker.networks) != 1 {
		t.Errorf("left: containers %v networks %v", r.docker.containers, r.docker.networks)
	}
	if _, err := r.p.Lookup(ctx, "t4"); err == nil {
		t.Errorf("lookup after close succeeded")
	}
}

// What a half-finished open of task "x-eval"'s agent environment left (its task network
// and agent container, no sidecar yet) has the name of task "x"'s evaluation
// environment. Removing x's by name (a resume's removal of a cut open, env close) must
// refuse it, naming its task; removing x-eval's own removes it.
func TestRemoveTaskRefusesAnotherTasksLeftovers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		task   string
		role   lifecycle.Role
		owner  string // of the leftovers; "" is the provider's own
		refuse string // what the error names, "" for a removal
	}{
		{"another task's agent environment", "x", lifecycle.RoleEvaluation, "", `task "x-eval"`},
		{"another owner's", "x-eval", lifecycle.RoleAgent, "someone-else", `owner "someone-else"`},
		{"its own", "x-eval", lifecycle.RoleAgent, "", ""},
		{"its own, role defaulted", "x-eval", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, "x-eval")
			r.halfOpen(t, "x-eval", tc.owner)
			err := r.p.RemoveTask(context.Background(), tc.task, tc.role)
			left := r.leftovers("x-eval")
			switch {
			case tc.refuse == "" && (err != nil || len(left) > 0):
				t.Errorf("RemoveTask(%q, %q): %v, left %v; want everything removed", tc.task, tc.role, err, left)
			case tc.refuse != "" && (err == nil || !strings.Contains(err.Error(), tc.refuse)):
				t.Errorf("RemoveTask(%q, %q): %v; want a refusal naming %s", tc.task, tc.role, err, tc.refuse)
			case tc.refuse != "" && len(left) != 2:
				t.Errorf("RemoveTask(%q, %q) refused but left only %v of the other's objects", tc.task, tc.role, left)
			}
		})
	}
}

// halfOpen leaves what an open of task's agent environment killed before its sidecar
// leaves: its task network, agent container and state directory, labelled for owner
// ("" is the provider's own).
func (r *rig) halfOpen(t *testing.T, task, owner string) {
	t.Helper()
	n := namesFor(task)
	labels := func(objRole string) map[string]string {
		l := r.p.labels(n, task, lifecycle.RoleAgent, objRole)
		if owner != "" {
			l[labelOwner] = owner
		}
		return l
	}
	if err := os.MkdirAll(filepath.Join(r.p.cfg.StateDir, task), 0o750); err != nil {
		t.Fatal(err)
	}
	r.docker.mu.Lock()
	defer r.docker.mu.Unlock()
	r.docker.networks[n.Network] = &fakeNetwork{name: n.Network, internal: true, labels: labels(roleNetwork)}
	r.docker.containers[n.Agent] = &fakeContainer{id: "agent-id", labels: labels(roleAgent), networks: map[string]bool{}}
}

// RemoveTask removes nothing while an open of that name holds the open lock: the
// objects it would find are that open's, half-made.
func TestRemoveTaskWaitsForAnOpenInFlight(t *testing.T) {
	r := newRig(t, "ro")
	r.halfOpen(t, "ro", "")
	unlock, err := r.p.lockOpen(context.Background(), "ro")
	if err != nil {
		t.Fatal(err)
	}
	// The short context only bounds how long the held lock is retried; the verdict
	// never depends on it.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := r.p.RemoveTask(ctx, "ro", lifecycle.RoleAgent); err == nil {
		t.Error("RemoveTask while an open holds the lock: nil error, want the lock's")
	}
	if left := r.leftovers("ro"); len(left) != 2 {
		t.Errorf("RemoveTask while an open holds the lock left only %v", left)
	}
	unlock()
	if err := r.p.RemoveTask(context.Background(), "ro", lifecycle.RoleAgent); err != nil {
		t.Fatalf("RemoveTask once the open let go: %v", err)
	}
	if left := r.leftovers("ro"); len(left) > 0 {
		t.Errorf("RemoveTask once the open let go left %v", left)
	}
}

// Close stops the sidecar (SIGTERM, a short grace) before it removes it: a forced
// removal kills it at once, and the decision lines it had batched were lost.
func TestCloseStopsTheSidecarBeforeRemovingIt(t *testing.T) {
	r := newRig(t, "t6")
	e := r.open(t, "t6", policy.NoNetwork)
	if err := e.Close(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	stop, remove := r.ev.index("stop "+e.names.Sidecar), r.ev.index("remove "+e.names.Sidecar)
	if stop < 0 || remove < stop {
		t.Fatalf("sidecar stopped at event %d and removed at %d, want a stop first: %v", stop, remove, r.ev.all())
	}
}

// The egress network the controller creates has traffic between its containers off:
// sidecars and public-mode agents of different tasks share it.
func TestEgressNetworkKeepsContainersApart(t *testing.T) {
	r := newRig(t, "t7")
	delete(r.docker.networks, r.p.cfg.EgressNetwork)
	if _, err := r.p.ensureEgressNetwork(context.Background()); err != nil {
		t.Fatal(err)
	}
	n := r.docker.networks[r.p.cfg.EgressNetwork]
	if n == nil || n.options[bridgeICC] != "false" {
		t.Fatalf("egress network %+v, want %s=false", n, bridgeICC)
	}
}

// doctor says whether the egress network keeps its containers apart, and how to get
// there when it does not.
func TestDoctorChecksTheEgressNetwork(t *testing.T) {
	for _, tc := range []struct {
		name      string
		options   map[string]string // nil: no network
		netFilter string
		ok        bool
	}{
		{"absent", nil, "absent", true},
		{"created by the controller", map[string]string{bridgeICC: "false"}, "1", true},
		{"created by hand, icc off as 0", map[string]string{bridgeICC: "0"}, "1", true},
		{"created by hand", map[string]string{}, "1", false},
		{"icc on", map[string]string{bridgeICC: "true"}, "1", false},
		{"icc off, br_netfilter off", map[string]string{bridgeICC: "false"}, "0", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, "t8")
			delete(r.docker.networks, r.p.cfg.EgressNetwork)
			if tc.options != nil {
				r.docker.networks[r.p.cfg.EgressNetwork] = &fakeNetwork{name: r.p.cfg.EgressNetwork, options: tc.options}
			}
			var got []Finding
			r.p.checkEgressNetwork(context.Background(), tc.netFilter, func(check string, ok bool, detail, fix string) {
				got = append(got, Finding{Check: check, OK: ok, Detail: detail, Fix: fix})
			})
			if len(got) != 1 || got[0].OK != tc.ok || (!tc.ok && got[0].Fix == "") {
				t.Fatalf("findings %+v, want one with ok %v", got, tc.ok)
			}
		})
	}
}

func TestLookupFromFreshProcess(t *testing.T) {
	r := newRig(t, "t5")
	opened := r.open(t, "t5", policy.NoNetwork)
	e, err := r.p.Lookup(context.Background(), "t5")
	if err != nil {
		t.Fatal(err)
	}
	if e.plan != opened.plan || e.AgentContainer() != opened.AgentContainer() || e.task != "t5" || !e.agentOwned {
		t.Errorf("lookup = %+v, open = %+v", e, opened)
	}
	if _, err := e.Apply(context.Background(), allowA, controller.PhaseLabel{Phase: "run"}); err != nil {
		t.Fatal(err)
	}
}

// An agent the provider creates has no raw sockets: with them it could hand-build
// IPv6 frames to the host bridge's link-local address, which the host answers.
func TestCreatedAgentHasNoRawSockets(t *testing.T) {
	r := newRig(t, "t1")
	e := r.open(t, "t1", policy.NoNetwork)
	r.docker.mu.Lock()
	defer r.docker.mu.Unlock()
	c, ok := r.docker.containers[e.AgentContainer()]
	if !ok {
		t.Fatalf("no container %s", e.AgentContainer())
	}
	if !slices.Contains(c.capDrop, "NET_RAW") {
		t.Fatalf("agent drops %v, want NET_RAW among them", c.capDrop)
	}
}

// Task "x-eval"'s agent environment and task "x"'s evaluation environment have the same
// name. Finding one by task and role must not hand back the other task's: a close, switch
// or resume of x's evaluation environment would act on x-eval's agent.
func TestLookupTaskRefusesAnotherTasksEnvironment(t *testing.T) {
	r := newRig(t, "x-eval")
	r.open(t, "x-eval", policy.NoNetwork)
	ctx := context.Background()
	for _, tc := range []struct {
		task string
		role lifecycle.Role
		ok   bool
	}{
		{"x-eval", lifecycle.RoleAgent, true},
		{"x-eval", "", true},
		{"x", lifecycle.RoleEvaluation, false},
	} {
		e, err := r.p.LookupTask(ctx, tc.task, tc.role)
		switch {
		case tc.ok && (err != nil || e.Task() != tc.task):
			t.Errorf("LookupTask(%q, %q): %v; want task %s's environment", tc.task, tc.role, err, tc.task)
		case !tc.ok && (err == nil || errors.Is(err, ErrNoEnvironment) || !strings.Contains(err.Error(), `task "x-eval"`)):
			// Not ErrNoEnvironment either: close would then remove by name what is left.
			t.Errorf("LookupTask(%q, %q) found %v (err %v); want an error naming the owner", tc.task, tc.role, e != nil, err)
		}
	}
}
