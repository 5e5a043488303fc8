package docker

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy"
)

// Parts of a switch, as named in transition records.
const (
	partRules   = "rules"   // the sidecar acknowledged the new rule set
	partWiring  = "wiring"  // Docker network connect/disconnect of the agent
	partRoutes  = "routes"  // default routes in the agent's namespace
	partSidecar = "sidecar" // sidecar restarted or reconnected (repair)
	partLink    = "link"    // the transparent path: the sidecar's table and the agent's link
)

// SwitchReport is a transition plus what the switch changed, for people.
type SwitchReport struct {
	controller.Transition
	Changes           []string `json:"changes"`
	ClosedConnections uint64   `json:"closed_connections"`
	FailClosed        []string `json:"fail_closed,omitempty"`
	// interim is the generation of the switch's no-network interim until the sidecar
	// acknowledges the new rules: a fail-closed PUT before then ends that generation,
	// whose blocked attempts count to the phase the switch ended.
	interim uint64
	// endedPhase labels the interim in the sidecar's logs and metrics: its decisions
	// count to the phase the switch ends, as its blocked attempts do.
	endedPhase string
}

// Apply puts pol in force. It returns only when the sidecar has acknowledged the new
// generation and the agent's wiring matches the mode; on error the agent has no egress.
func (e *Env) Apply(ctx context.Context, pol policy.Policy, label controller.PhaseLabel) (controller.Transition, error) {
	r, err := e.Switch(ctx, pol, label)
	return r.Transition, err
}

// Switch is Apply with a report of the changes made.
//
// The order of steps keeps the agent's egress, at every instant, within what the old or
// the new policy allows: a restricting switch cuts the wiring before it puts the new
// rules, a widening switch changes the rules before it connects. An agent that leaves
// its direct wiring (public, or an attached container's networks) gets no-network rules
// before the cut: a controller killed between the cut and the new rules would otherwise
// leave the old rules in the sidecar, which under public let everything through it. So
// at every instant of such a switch the agent has either its old wiring (nothing is cut
// yet: what it had) or nothing beyond the new policy.
func (e *Env) Switch(ctx context.Context, pol policy.Policy, label controller.PhaseLabel) (SwitchReport, error) {
	clk := e.p.cfg.Clock
	r := SwitchReport{Transition: controller.Transition{
		Time: clk.Now(), Task: e.task, Environment: e.names.Env, Phase: label.Phase,
		ToMode: pol.Mode, Digest: pol.Digest(), Parts: map[string]time.Duration{},
	}}
	if !pol.Mode.Valid() {
		return r, fmt.Errorf("docker: switch %s: invalid policy", e.names.Env)
	}
	// compass-proxy refuses such a label with the whole PUT, which a restricting switch
	// sends only after cutting the wiring: the switch would fail closed for a label.
	if !adminapi.ValidLabel(label.Phase) {
		return r, fmt.Errorf("docker: switch %s: phase label %s: %s", e.names.Env, policy.Quote(label.Phase), adminapi.LabelRule)
	}
	unlock, err := e.lock(ctx)
	if err != nil && ctx.Err() != nil {
		// The deadline passed waiting for another controller. Callers take the error
		// for "no egress" (the runner records no-network); the fail-closed steps only
		// ever restrict, so they are safe beside the controller holding the lock.
		r.FailClosed, r.PreviousBlocked, err = e.failClosed(ctx, err)
		r.Error = err.Error()
		return r, err
	}
	if err != nil {
		return r, err // no lock file (another --state-dir?): nothing was touched
	}
	defer unlock()
	start := clk.Now()
	if prev, ok, err := e.dir.readIntent(); err == nil && ok {
		r.FromMode, r.endedPhase = prev.Policy.Mode, prev.Phase
	}
	err = e.dir.writeIntent(intent{Policy: pol, Digest: pol.Digest(), Phase: label.Phase, Time: r.Time})
	var panicked any
	if err == nil {
		panicked, err = e.runSteps(ctx, pol, label, &r)
	}
	if err != nil {
		var prev *adminapi.BlockedSummary
		r.FailClosed, prev, err = e.failClosed(ctx, err)
		switch {
		case r.PreviousBlocked == nil:
			// The rules never changed, so the fail-closed PUT is what ended the old
			// generation. Had they changed, the first PUT's summary is the old phase's.
			r.PreviousBlocked = prev
		case prev != nil && r.interim != 0 && prev.Generation == r.interim:
			r.PreviousBlocked = mergeBlocked(*r.PreviousBlocked, *prev)
		}
		r.Error = err.Error()
	} else {
		r.OK = true
	}
	r.Duration = clk.Since(start)
	if lerr := e.dir.appendTransition(r.Transition); lerr != nil {
		e.p.log.Error("transition log", "env", e.names.Env, "err", lerr)
		if err == nil {
			// Callers take an error for "no egress": an unrecorded switch must leave none.
			r.OK = false
			r.FailClosed, _, err = e.failClosed(ctx, lerr)
			r.Error = err.Error()
		}
	}
	e.p.log.Info("switch", "env", e.names.Env, "phase", label.Phase, "from", r.FromMode, "to", r.ToMode,
		"digest", r.Digest, "generation", r.Generation, "ok", r.OK, "duration_ms", r.Duration.Milliseconds())
	if panicked != nil {
		panic(panicked)
	}
	return r, err
}

// runSteps runs switchSteps and turns a panic (a client bug) into the error it returns
// with it: the switch then fails closed and is recorded as any failed one (a process
// that survives the panic, the runner recovering it, must not keep a half-done switch,
// nor a status that takes it for one killed), and Switch panics again afterwards.
func (e *Env) runSteps(ctx context.Context, pol policy.Policy, label controller.PhaseLabel, r *SwitchReport) (panicked any, err error) {
	defer func() {
		if p := recover(); p != nil {
			panicked, err = p, fmt.Errorf("docker: switch %s panicked: %v", e.names.Env, p)
		}
	}()
	return nil, e.switchSteps(ctx, pol, label, r)
}

func (e *Env) timed(r *SwitchReport, part string, f func() error) error {
	if e.p.cfg.StepDelay > 0 {
		time.Sleep(e.p.cfg.StepDelay)
	}
	t := e.p.cfg.Clock.Now()
	err := f()
	r.Parts[part] += e.p.cfg.Clock.Since(t)
	return err
}

func (e *Env) switchSteps(ctx context.Context, pol policy.Policy, label controller.PhaseLabel, r *SwitchReport) error {
	agent, err := e.p.api.ContainerInspect(ctx, e.agentRef)
	if err != nil {
		return fmt.Errorf("docker: inspect agent %s: %w", e.agentRef, err)
	}
	if agent.State == nil || !agent.State.Running {
		return fmt.Errorf("docker: agent %s is not running", e.agentRef)
	}
	if err := e.timed(r, partSidecar, func() error { return e.ensureSidecarRunning(ctx, r) }); err != nil {
		return err
	}
	if pol.Restricted() {
		return e.restrictSteps(ctx, agent, pol, label, r)
	}
	if err := e.timed(r, partRules, func() error { return e.putRules(ctx, pol, label.Phase, r) }); err != nil {
		return err
	}
	if err := e.timed(r, partSidecar, func() error { return e.ensureSidecarEgress(ctx, r) }); err != nil {
		return err
	}
	// A network the environment does not manage is egress nobody decided on, even
	// under public.
	if err := e.timed(r, partWiring, func() error { return e.detachAgent(ctx, agent, r, e.names.Network, e.egressNet) }); err != nil {
		return err
	}
	// The transparent path goes before the agent is connected: its route out must be
	// Docker's alone.
	if err := e.timed(r, partLink, func() error {
		pid, err := e.sameAgent(ctx, agent)
		if err != nil {
			return err
		}
		return e.removeLink(ctx, pid, r)
	}); err != nil {
		return err
	}
	if !connectedTo(agent, e.egressNet) {
		err := e.timed(r, partWiring, func() error {
			if err := e.p.api.NetworkConnect(ctx, e.egressNet, e.agentRef, &network.EndpointSettings{}); err != nil {
				return fmt.Errorf("docker: connect agent to %s: %w", e.egressNet, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
		r.Changes = append(r.Changes, "agent connected to "+e.egressNet)
	}
	return e.timed(r, partRoutes, func() error {
		pid, err := e.sameAgent(ctx, agent)
		if err != nil {
			return err
		}
		return e.publicRoute(ctx, pid, r)
	})
}

// restrictSteps switches to a restricted mode: the agent leaves every network but the
// task network and loses every default route, then gets the transparent path (the
// sidecar's table, then the link with the one default route via the sidecar), checked,
// and only then the new rules.
func (e *Env) restrictSteps(ctx context.Context, agent container.InspectResponse, pol policy.Policy, label controller.PhaseLabel, r *SwitchReport) error {
	// Every network but the task network may lead out, whichever egress network
	// this process is configured with, so the agent leaves all of them.
	interim := len(otherNetworks(agent, e.names.Network)) > 0
	if interim {
		phase := r.endedPhase
		if pol.Equal(policy.NoNetwork) {
			phase = label.Phase // the interim is the switch's own policy
		}
		if err := e.timed(r, partRules, func() error { return e.putRules(ctx, policy.NoNetwork, phase, r) }); err != nil {
			return err
		}
	}
	if err := e.timed(r, partWiring, func() error { return e.detachAgent(ctx, agent, r, e.names.Network) }); err != nil {
		return err
	}
	var pid int
	if err := e.timed(r, partRoutes, func() (err error) {
		if pid, err = e.sameAgent(ctx, agent); err != nil {
			return err
		}
		return e.cutRoutes(pid, r)
	}); err != nil {
		return err
	}
	if err := e.timed(r, partLink, func() error { return e.ensureLink(ctx, pid, r) }); err != nil {
		return err
	}
	if !interim || !pol.Equal(policy.NoNetwork) {
		if err := e.timed(r, partRules, func() error { return e.putRules(ctx, pol, label.Phase, r) }); err != nil {
			return err
		}
	}
	return e.timed(r, partSidecar, func() error { return e.ensureSidecarEgress(ctx, r) })
}

// sameAgent re-inspects the agent right before its routes are edited and returns its
// pid, refusing if it is not the process inspected at the start of the switch: the
// sidecar wait and the rewiring take time, and a restarted agent's old pid may by now
// name another namespace, whose routes the check would then find gone.
func (e *Env) sameAgent(ctx context.Context, was container.InspectResponse) (int, error) {
	now, err := e.p.api.ContainerInspect(ctx, e.agentRef)
	if err != nil {
		return 0, fmt.Errorf("docker: inspect agent %s: %w", e.agentRef, err)
	}
	if now.State == nil || !now.State.Running {
		return 0, fmt.Errorf("docker: agent %s stopped during the switch", e.agentRef)
	}
	if now.ID != was.ID || now.State.Pid != was.State.Pid || now.State.StartedAt != was.State.StartedAt {
		return 0, fmt.Errorf("docker: agent %s restarted during the switch (pid %d started %q, now pid %d started %q): routes not edited through a stale pid",
			e.agentRef, was.State.Pid, was.State.StartedAt, now.State.Pid, now.State.StartedAt)
	}
	return now.State.Pid, nil
}

func connectedTo(ci container.InspectResponse, net string) bool {
	if ci.NetworkSettings == nil {
		return false
	}
	_, ok := ci.NetworkSettings.Networks[net]
	return ok
}

// detachAgent disconnects the agent (as inspected) from every network but keep. A network
// that refuses does not stop it: each of the others may lead out too.
func (e *Env) detachAgent(ctx context.Context, agent container.InspectResponse, r *SwitchReport, keep ...string) error {
	var errs []error
	for _, net := range otherNetworks(agent, keep...) {
		if err := e.p.api.NetworkDisconnect(ctx, net, e.agentRef, true); err != nil && !ignorableDisconnect(err) {
			errs = append(errs, fmt.Errorf("docker: disconnect agent from %s: %w", net, err))
			continue
		}
		r.Changes = append(r.Changes, "agent disconnected from "+net)
	}
	return errors.Join(errs...)
}

// otherNetworks lists, sorted, the networks ci is connected to that are not in keep.
func otherNetworks(ci container.InspectResponse, keep ...string) []string {
	if ci.NetworkSettings == nil {
		return nil
	}
	var out []string
	for net := range ci.NetworkSettings.Networks {
		if !slices.Contains(keep, net) {
			out = append(out, net)
		}
	}
	sort.Strings(out)
	return out
}

// cutRoutes removes every default route in the agent's namespace but the transparent
// link's (an earlier restricted switch's: it leads only to the sidecar) and checks no
// other is left.
func (e *Env) cutRoutes(pid int, r *SwitchReport) error {
	removed, err := e.p.routes.RemoveDefaultRoutes(pid, e.link.Gateway())
	if err != nil {
		return err
	}
	for _, gw := range removed {
		r.Changes = append(r.Changes, "default route via "+gw.String()+" removed")
	}
	left, err := e.p.routes.DefaultRoutes(pid)
	if err != nil {
		return err
	}
	for _, gw := range left {
		if gw != e.link.Gateway() {
			return fmt.Errorf("docker: default routes still present in the agent namespace: %v", left)
		}
	}
	return nil
}

// publicRoute leaves exactly one default route, via the egress network's gateway.
func (e *Env) publicRoute(ctx context.Context, pid int, r *SwitchReport) error {
	gw, err := e.egressGateway(ctx)
	if err != nil {
		return err
	}
	removed, err := e.p.routes.RemoveDefaultRoutes(pid, gw)
	if err != nil {
		return err
	}
	for _, g := range removed {
		r.Changes = append(r.Changes, "default route via "+g.String()+" removed")
	}
	left, err := e.p.routes.DefaultRoutes(pid)
	if err != nil {
		return err
	}
	if len(left) == 0 {
		if err := e.p.routes.AddDefaultRoute(pid, gw); err != nil {
			return err
		}
		r.Changes = append(r.Changes, "default route via "+gw.String()+" added")
	}
	return nil
}

func (e *Env) egressGateway(ctx context.Context) (netip.Addr, error) {
	ni, err := e.p.api.NetworkInspect(ctx, e.egressNet, network.InspectOptions{})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("docker: inspect %s: %w", e.egressNet, err)
	}
	for _, c := range ni.IPAM.Config {
		if gw, err := netip.ParseAddr(c.Gateway); err == nil && gw.Is4() {
			return gw, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("docker: egress network %s has no IPv4 gateway", e.egressNet)
}

// putRules puts pol in the sidecar under the phase label given. The switch's own policy
// sets the transition's generation; another (the no-network interim) is kept in
// r.interim, so that a failed switch does not record a generation that never held
// its policy.
func (e *Env) putRules(ctx context.Context, pol policy.Policy, phase string, r *SwitchReport) error {
	ack, err := e.admin.PutPolicy(ctx, pol, e.task, phase)
	// A swap acknowledged with the wrong digest still ended the old generation. What the
	// no-network interim of a switch blocked counts to the phase the switch ended.
	switch {
	case r.interim == 0:
		r.PreviousBlocked = ack.PreviousBlocked
	case r.PreviousBlocked != nil && ack.PreviousBlocked != nil:
		r.PreviousBlocked = mergeBlocked(*r.PreviousBlocked, *ack.PreviousBlocked)
	}
	if err != nil {
		return fmt.Errorf("docker: sidecar %s: %w", e.names.Sidecar, err)
	}
	if pol.Digest() == r.Digest {
		r.Generation, r.interim = ack.Generation, 0
	} else {
		r.interim = ack.Generation
	}
	r.ClosedConnections += ack.ClosedConnections
	r.Changes = append(r.Changes, fmt.Sprintf("sidecar rules: %s generation %d", pol.Mode, ack.Generation))
	if ack.ClosedConnections > 0 {
		r.Changes = append(r.Changes, fmt.Sprintf("%d live connections closed", ack.ClosedConnections))
	}
	return nil
}

// ensureSidecarRunning restarts a stopped sidecar (repair after a crash or a Docker
// restart); it comes back with no network allowed until the rules are put again.
func (e *Env) ensureSidecarRunning(ctx context.Context, r *SwitchReport) error {
	sc, err := e.p.api.ContainerInspect(ctx, e.names.Sidecar)
	if err != nil {
		return fmt.Errorf("docker: inspect sidecar %s: %w", e.names.Sidecar, err)
	}
	if sc.State != nil && sc.State.Running {
		return nil
	}
	if err := e.p.api.ContainerStart(ctx, e.names.Sidecar, container.StartOptions{}); err != nil {
		return fmt.Errorf("docker: restart sidecar %s: %w", e.names.Sidecar, err)
	}
	r.Changes = append(r.Changes, "sidecar restarted")
	return e.waitReady(ctx, defaultProxyTimeout)
}

// ensureSidecarEgress reconnects a sidecar that a failed switch cut from the egress
// network; it runs only after the sidecar acknowledged the new rules.
func (e *Env) ensureSidecarEgress(ctx context.Context, r *SwitchReport) error {
	sc, err := e.p.api.ContainerInspect(ctx, e.names.Sidecar)
	if err != nil {
		return fmt.Errorf("docker: inspect sidecar %s: %w", e.names.Sidecar, err)
	}
	if connectedTo(sc, e.egressNet) {
		return nil
	}
	if err := e.p.api.NetworkConnect(ctx, e.egressNet, e.names.Sidecar, &network.EndpointSettings{}); err != nil {
		return fmt.Errorf("docker: reconnect sidecar to %s: %w", e.egressNet, err)
	}
	r.Changes = append(r.Changes, "sidecar reconnected to "+e.egressNet)
	return nil
}

// failClosed leaves the agent with no egress after a failed switch: no direct wiring,
// no default route, and a sidecar that either denies everything or has no way out. It
// also returns the blocked summary the sidecar reported for the generation it ended, if any.
func (e *Env) failClosed(ctx context.Context, cause error) ([]string, *adminapi.BlockedSummary, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	var done []string
	var errs []error
	// The sidecar first: a process killed between the agent's cut and this would leave
	// the agent, with no direct path left, whatever the sidecar still allows (all of
	// public, when the switch failed before its no-network interim).
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	ack, err := e.admin.PutPolicy(pctx, policy.NoNetwork, e.task, "fail-closed")
	pcancel()
	var prev *adminapi.BlockedSummary
	if err == nil {
		prev = ack.PreviousBlocked
		done = append(done, fmt.Sprintf("sidecar rules: no-network generation %d", ack.Generation))
	} else if derr := e.p.api.NetworkDisconnect(ctx, e.egressNet, e.names.Sidecar, true); derr != nil && !ignorableDisconnect(derr) {
		errs = append(errs, fmt.Errorf("sidecar unreachable (%v) and could not be cut from %s: %w", err, e.egressNet, derr))
	} else {
		done = append(done, "sidecar unreachable, cut from "+e.egressNet)
	}
	if agent, err := e.p.api.ContainerInspect(ctx, e.agentRef); err != nil {
		// Without the agent's network list, at least the egress network goes.
		errs = append(errs, fmt.Errorf("docker: inspect agent %s: %w", e.agentRef, err))
		if derr := e.p.api.NetworkDisconnect(ctx, e.egressNet, e.agentRef, true); derr != nil && !ignorableDisconnect(derr) {
			errs = append(errs, fmt.Errorf("docker: disconnect agent from %s: %w", e.egressNet, derr))
		}
	} else {
		var rep SwitchReport
		if err := e.detachAgent(ctx, agent, &rep, e.names.Network); err != nil {
			errs = append(errs, err)
		} else {
			done = append(done, "agent on no network but "+e.names.Network)
		}
	}
	if ci, err := e.p.api.ContainerInspect(ctx, e.agentRef); err != nil {
		errs = append(errs, fmt.Errorf("docker: inspect agent %s for its routes: %w", e.agentRef, err))
	} else if ci.State != nil && ci.State.Running {
		if _, err := e.p.routes.RemoveDefaultRoutes(ci.State.Pid, netip.Addr{}); err != nil {
			errs = append(errs, err)
		} else {
			done = append(done, "agent default routes removed")
		}
	}
	msg := fmt.Sprintf("docker: switch of %s failed, agent left with no egress (%s): %v", e.names.Env, strings.Join(done, "; "), cause)
	if len(errs) > 0 {
		return done, prev, fmt.Errorf("%s; FAIL-CLOSED INCOMPLETE: %w", msg, errors.Join(errs...))
	}
	return done, prev, errors.New(msg)
}
