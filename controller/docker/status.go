package docker

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"time"

	cerrdefs "github.com/containerd/errdefs"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy"
)

// Status compares what the controller intended with what it finds in Docker, in the
// sidecar and in the agent's namespace. Problems lists every mismatch; a switch to the
// intended policy repairs them.
type Status struct {
	Env         string                  `json:"env"`
	Task        string                  `json:"task"`
	Role        string                  `json:"role"`
	Intended    *IntendedPolicy         `json:"intended,omitempty"`
	Sidecar     SidecarState            `json:"sidecar"`
	Wiring      Wiring                  `json:"wiring"`
	Transparent TransparentPath         `json:"transparent"`
	Transitions []controller.Transition `json:"transitions"`
	Problems    []string                `json:"problems"`
	OK          bool                    `json:"ok"`
}

// IntendedPolicy is the policy the last switch set out to put in force.
type IntendedPolicy struct {
	Mode   policy.Mode   `json:"mode"`
	Digest string        `json:"digest"`
	Phase  string        `json:"phase"`
	Policy policy.Policy `json:"policy"`
	Since  time.Time     `json:"since"`
}

// SidecarState is what the sidecar container and its admin API say.
type SidecarState struct {
	Running    bool        `json:"running"`
	Ready      bool        `json:"ready"`
	Generation uint64      `json:"generation"`
	Digest     string      `json:"digest"`
	Mode       policy.Mode `json:"mode"`
	Phase      string      `json:"phase"`
	OnEgress   bool        `json:"on_egress_network"`
	OnTaskNet  bool        `json:"on_task_network"`
	Error      string      `json:"error,omitempty"`
}

// Wiring is the agent's connectivity as Docker and the kernel see it.
type Wiring struct {
	AgentRunning  bool     `json:"agent_running"`
	Networks      []string `json:"networks"`
	OnEgress      bool     `json:"on_egress_network"`
	DefaultRoutes []string `json:"default_routes"`
	Error         string   `json:"error,omitempty"`
}

// TransparentPath is the agent's link to its sidecar and the sidecar's table, which
// restricted modes need and public must not have.
type TransparentPath struct {
	Link    string `json:"link"`    // "ce-a3/ce-s3 169.254.1.12/30"
	Gateway string `json:"gateway"` // the agent's one default gateway in restricted modes
	// Problems are the table's and the link's differences from what restricted modes
	// need (checked only when one is intended).
	Problems []string `json:"problems"`
	// Dropped counts what the table dropped since the phase began, per class (udp,
	// icmp, other, spoofed); absent without a table.
	Dropped controller.Drops `json:"dropped,omitempty"`
	Error   string           `json:"error,omitempty"`
}

// Status inspects the environment; it never changes anything.
func (e *Env) Status(ctx context.Context) (Status, error) {
	st := Status{Env: e.names.Env, Task: e.task, Role: string(e.role), Problems: []string{}}
	problem := func(format string, args ...any) { st.Problems = append(st.Problems, fmt.Sprintf(format, args...)) }

	in, ok, err := e.dir.readIntent()
	if err != nil {
		return st, err
	}
	if ok {
		st.Intended = &IntendedPolicy{Mode: in.Policy.Mode, Digest: in.Digest, Phase: in.Phase, Policy: in.Policy, Since: in.Time}
	} else {
		problem("no intended policy recorded (open or switch did not complete)")
	}

	sc, err := e.p.api.ContainerInspect(ctx, e.names.Sidecar)
	scPID := 0
	switch {
	case cerrdefs.IsNotFound(err):
		problem("sidecar %s is missing", e.names.Sidecar)
	case err != nil:
		return st, fmt.Errorf("docker: inspect sidecar: %w", err)
	default:
		st.Sidecar.Running = sc.State != nil && sc.State.Running
		if st.Sidecar.Running {
			scPID = sc.State.Pid
		}
		st.Sidecar.OnEgress = connectedTo(sc, e.egressNet)
		st.Sidecar.OnTaskNet = connectedTo(sc, e.names.Network)
	}
	if st.Sidecar.Running {
		if err := e.admin.Ready(ctx); err != nil {
			st.Sidecar.Error = err.Error()
		} else {
			st.Sidecar.Ready = true
		}
		if ack, err := e.admin.GetPolicy(ctx); err != nil {
			st.Sidecar.Error = err.Error()
		} else {
			st.Sidecar.Generation, st.Sidecar.Digest, st.Sidecar.Mode, st.Sidecar.Phase = ack.Generation, ack.Digest, ack.Mode, ack.Phase
		}
	}
	switch {
	case !st.Sidecar.Running:
		problem("sidecar is not running: degraded, the agent has no egress through it")
	case !st.Sidecar.Ready:
		problem("sidecar is not ready: %s", st.Sidecar.Error)
	}
	if st.Sidecar.Running && !st.Sidecar.OnEgress {
		problem("sidecar is not connected to %s (cut by a failed switch?)", e.egressNet)
	}
	if st.Sidecar.Running && !st.Sidecar.OnTaskNet {
		problem("sidecar is not connected to %s", e.names.Network)
	}
	if st.Intended != nil && st.Sidecar.Ready && st.Sidecar.Digest != st.Intended.Digest {
		problem("sidecar enforces %s (%s) but %s (%s) is intended", st.Sidecar.Mode, short(st.Sidecar.Digest), st.Intended.Mode, short(st.Intended.Digest))
	}

	agentPID := e.inspectWiring(ctx, &st, problem)
	e.inspectTransparent(&st, agentPID, scPID, problem)
	st.Transitions, err = e.dir.lastTransitions(5)
	if err != nil {
		return st, err
	}
	// Every switch records its end, ok or failed, with the time its intent carries. A
	// switch without one was killed (or is still at work): whatever it left may look
	// right, but no step after the last one it took was checked.
	if in := st.Intended; in != nil && !endRecorded(st.Transitions, in.Since) {
		problem("the switch to %s (%s) started %s has no recorded end: its controller was killed or is still at work; switch to it again", in.Mode, short(in.Digest), in.Since.Format(time.RFC3339Nano))
	}
	st.OK = len(st.Problems) == 0
	return st, nil
}

// inspectWiring returns the agent's pid, 0 if it is not running.
func (e *Env) inspectWiring(ctx context.Context, st *Status, problem func(string, ...any)) int {
	agent, err := e.p.api.ContainerInspect(ctx, e.agentRef)
	if err != nil {
		st.Wiring.Error = err.Error()
		problem("agent %s: %v", e.agentRef, err)
		return 0
	}
	st.Wiring.AgentRunning = agent.State != nil && agent.State.Running
	st.Wiring.Networks = []string{}
	if agent.NetworkSettings != nil {
		for n := range agent.NetworkSettings.Networks {
			st.Wiring.Networks = append(st.Wiring.Networks, n)
			if n != e.names.Network && n != e.egressNet {
				problem("agent is connected to %s, which this controller does not manage", n)
			}
		}
	}
	sort.Strings(st.Wiring.Networks)
	st.Wiring.OnEgress = connectedTo(agent, e.egressNet)
	if !st.Wiring.AgentRunning {
		problem("agent %s is not running", e.agentRef)
		return 0
	}
	pid := agent.State.Pid
	routes, err := e.p.routes.DefaultRoutes(pid)
	if err != nil {
		st.Wiring.Error = err.Error()
		problem("cannot read the agent's routes: %v", err)
		return pid
	}
	st.Wiring.DefaultRoutes = []string{}
	for _, r := range routes {
		st.Wiring.DefaultRoutes = append(st.Wiring.DefaultRoutes, r.String())
	}
	if st.Intended == nil {
		return pid
	}
	if st.Intended.Mode == policy.ModePublic {
		if !st.Wiring.OnEgress {
			problem("public is intended but the agent is not connected to %s", e.egressNet)
		}
		gw, err := e.egressGateway(ctx)
		if err != nil {
			problem("cannot check the agent's default routes: %v", err)
			return pid
		}
		if !containsAddr(routes, gw) {
			problem("public is intended but the agent has no default route via %s", gw)
		}
		// The docs promise exactly one: any other is a way out nobody decided on.
		for _, r := range routes {
			if r != gw {
				problem("public is intended but the agent also has a default route via %s", r)
			}
		}
		return pid
	}
	if st.Wiring.OnEgress {
		problem("%s is intended but the agent is connected to %s", st.Intended.Mode, e.egressNet)
	}
	if len(routes) != 1 || routes[0] != e.link.Gateway() {
		problem("%s is intended but the agent's default routes are %v, not exactly the transparent link's (via %v)", st.Intended.Mode, st.Wiring.DefaultRoutes, e.link.Gateway())
	}
	return pid
}

// inspectTransparent reads the drop counters and, when a restricted mode is intended,
// checks the table and the link.
func (e *Env) inspectTransparent(st *Status, agentPID, scPID int, problem func(string, ...any)) {
	t := &st.Transparent
	t.Link, t.Gateway, t.Problems = e.link.String(), e.link.Gateway().String(), []string{}
	if scPID == 0 {
		return // the sidecar's problem is reported already; its table went with it
	}
	var err error
	if t.Dropped, err = e.p.link.Counters(scPID, e.link); err != nil {
		t.Error = err.Error()
		problem("cannot read the transparent path's drop counters: %v", err)
	}
	if st.Intended == nil || st.Intended.Mode == policy.ModePublic || agentPID == 0 {
		return
	}
	problems, err := e.p.link.Check(agentPID, scPID, e.link)
	if err != nil {
		t.Error = err.Error()
		problem("cannot check the transparent path: %v", err)
		return
	}
	t.Problems = append(t.Problems, problems...)
	for _, p := range t.Problems {
		problem("transparent path: %s", p)
	}
}

// endRecorded reports whether the last transition is the end of the switch that started
// at since.
func endRecorded(trs []controller.Transition, since time.Time) bool {
	return len(trs) > 0 && trs[len(trs)-1].Time.Equal(since)
}

func containsAddr(list []netip.Addr, a netip.Addr) bool {
	for _, x := range list {
		if x == a {
			return true
		}
	}
	return false
}

func short(digest string) string {
	const n = len("sha256:") + 12
	if len(digest) > n {
		return digest[:n]
	}
	return digest
}

// Summary is one managed environment in a listing.
type Summary struct {
	Env     string `json:"env"`
	Task    string `json:"task"`
	Role    string `json:"role"`
	Sidecar string `json:"sidecar"`
	Agent   string `json:"agent"`
	State   string `json:"sidecar_state"`
	Created string `json:"created"`
}

// List returns the environments this controller manages on this host.
func (p *Provider) List(ctx context.Context) ([]Summary, error) {
	cs, err := p.listManaged(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Summary, 0, len(cs))
	for _, c := range cs {
		name := ""
		if len(c.Names) > 0 {
			name = c.Names[0][1:]
		}
		out = append(out, Summary{
			Env: c.Labels[labelEnv], Task: c.Labels[labelTask], Role: c.Labels[labelEnvRole],
			Sidecar: name, Agent: c.Labels[labelAgent], State: string(c.State),
			Created: time.Unix(c.Created, 0).UTC().Format(time.RFC3339),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Env < out[j].Env })
	return out, nil
}
