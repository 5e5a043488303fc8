package docker

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/internal/filelock"
	"github.com/compass-egress/compass-egress/net/egresslink"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// Env is one Docker environment: a sidecar, a per-task internal network and an agent.
// Everything it knows it can re-read from Docker labels and the state directory, so a
// fresh process (Lookup) works on an environment another process opened.
type Env struct {
	p          *Provider
	names      names
	task       string
	role       lifecycle.Role
	plan       subnetPlan
	link       egresslink.Spec // the transparent path of restricted modes
	dir        stateDir
	admin      *adminapi.Client
	egressNet  string
	agentRef   string // agent container name or ID
	agentOwned bool   // open created it (close removes it)
}

var (
	_ controller.Environment = (*Env)(nil)
	_ controller.DropCounter = (*Env)(nil)
)

// ID is the environment name.
func (e *Env) ID() string { return e.names.Env }

// Task is the task the environment belongs to.
func (e *Env) Task() string { return e.task }

// AgentContainer is the agent container's name or ID.
func (e *Env) AgentContainer() string { return e.agentRef }

// SidecarContainer is the sidecar container's name.
func (e *Env) SidecarContainer() string { return e.names.Sidecar }

// Network is the name of the per-task internal network.
func (e *Env) Network() string { return e.names.Network }

// SidecarAddr is the sidecar's address on the task network (proxy :3128, DNS :53).
func (e *Env) SidecarAddr() netip.Addr { return e.plan.Sidecar }

// StateDir is the environment's directory under the provider's state directory.
func (e *Env) StateDir() string { return string(e.dir) }

// ErrNoEnvironment means no environment of that name exists on this host.
var ErrNoEnvironment = errors.New("docker: no such environment")

// Lookup finds an environment by name (EnvID) from its Docker labels.
func (p *Provider) Lookup(ctx context.Context, env string) (*Env, error) {
	n := namesFor(env)
	sc, err := p.api.ContainerInspect(ctx, n.Sidecar)
	if cerrdefs.IsNotFound(err) {
		return nil, fmt.Errorf("%w: %s", ErrNoEnvironment, env)
	}
	if err != nil {
		return nil, fmt.Errorf("docker: inspect sidecar %s: %w", n.Sidecar, err)
	}
	l := sc.Config.Labels
	if l[labelManaged] != "true" || l[labelOwner] != p.cfg.Owner {
		return nil, fmt.Errorf("docker: %s is not managed by this controller (owner %q)", n.Sidecar, l[labelOwner])
	}
	e := &Env{
		p: p, names: n, task: l[labelTask], role: lifecycle.Role(l[labelEnvRole]),
		dir: stateDir(filepath.Join(p.cfg.StateDir, env)), agentRef: l[labelAgent],
	}
	if e.egressNet, err = openedEgress(sc); err != nil {
		return nil, err
	}
	e.agentOwned, _ = strconv.ParseBool(l[labelAgentOwned])
	e.admin = p.adminFor(e.dir.socket())
	ni, err := p.api.NetworkInspect(ctx, n.Network, network.InspectOptions{})
	if err != nil {
		return nil, fmt.Errorf("docker: inspect task network %s: %w", n.Network, err)
	}
	if len(ni.IPAM.Config) == 0 {
		return nil, fmt.Errorf("docker: task network %s has no subnet", n.Network)
	}
	sub, err := netip.ParsePrefix(ni.IPAM.Config[0].Subnet)
	if err != nil {
		return nil, fmt.Errorf("docker: task network %s: %w", n.Network, err)
	}
	e.plan = planFor(sub)
	if err := e.loadLink(); err != nil {
		return nil, err
	}
	return e, nil
}

// LookupTask finds the environment of a task's role. Names alone are ambiguous: task
// "x"'s evaluation environment and task "x-eval"'s agent environment are both "x-eval",
// so the sidecar's labels must name this task and role.
func (p *Provider) LookupTask(ctx context.Context, task string, role lifecycle.Role) (*Env, error) {
	if role == "" {
		role = lifecycle.RoleAgent
	}
	env := EnvID(task, role)
	e, err := p.Lookup(ctx, env)
	if err != nil {
		return nil, err
	}
	got := e.role
	if got == "" {
		got = lifecycle.RoleAgent
	}
	if e.task != task || got != role {
		return nil, fmt.Errorf("docker: environment %s belongs to task %q (%s environment), not to task %q (%s environment)", env, e.task, got, task, role)
	}
	return e, nil
}

// openedEgress is the egress network an environment was opened with: the sidecar's
// label, or for a sidecar created before the label, the network it was created on.
func openedEgress(sc container.InspectResponse) (string, error) {
	if n := sc.Config.Labels[labelEgressNet]; n != "" {
		return n, nil
	}
	if sc.HostConfig != nil {
		if m := sc.HostConfig.NetworkMode; m.IsUserDefined() {
			return string(m), nil
		}
	}
	return "", fmt.Errorf("docker: sidecar %s: no label %s and no network mode naming its egress network", sc.Name, labelEgressNet)
}

// lock serialises switches of one environment across processes (flock on the state
// directory), so two controllers never interleave wiring steps.
func (e *Env) lock(ctx context.Context) (unlock func(), err error) {
	path := filepath.Join(string(e.dir), "lock")
	return flock(ctx, path, func() {
		e.p.log.Warn("waiting for another controller's lock", "env", e.names.Env, "lock", path)
	})
}

// flock takes an exclusive lock on path, waiting until ctx ends; busy (if not nil) is
// called once if another process holds it.
func flock(ctx context.Context, path string, busy func()) (unlock func(), err error) {
	f, err := filelock.Lock(ctx, path, busy)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, fmt.Errorf("state: lock %s held by another controller: %w", path, err)
	case err != nil:
		return nil, fmt.Errorf("state: lock: %w", err)
	}
	return func() { f.Close() }, nil
}

// Blocked summarises the blocked attempts under the policy in force.
func (e *Env) Blocked(ctx context.Context) (adminapi.BlockedSummary, error) {
	s, err := e.admin.Blocked(ctx)
	if err != nil {
		return s, fmt.Errorf("docker: %s: %w", e.names.Env, err)
	}
	return s, nil
}

// Close removes the environment. With retain nothing is touched: the environment keeps
// running under the policy in force, and a later Close without retain removes it.
func (e *Env) Close(ctx context.Context, retain bool) error {
	if retain {
		return nil
	}
	return e.remove(ctx)
}

// remove deletes everything the environment owns; objects already gone are fine, so it
// is idempotent. An attached container is left on no network at all: handing it back
// its old networks would give it egress nobody decided on.
func (e *Env) remove(ctx context.Context) error {
	// A switch in flight (another controller) would otherwise go on rewiring what this
	// removes: connect an attached container to the egress network after it was taken
	// off, its environment then gone. Without a state directory there is no lock, and
	// nothing a switch could record its work in (it fails closed).
	unlock, err := e.lock(ctx)
	switch {
	case err == nil:
		defer unlock()
	case ctx.Err() != nil:
		return fmt.Errorf("docker: close %s: nothing removed: %w", e.names.Env, err)
	}
	if !e.agentOwned && e.agentRef != "" {
		// The sidecar's label is the only record of an attached container: it goes only
		// once that container is off every network, or a close that failed or died
		// half-way would leave a later close (by name, without a sidecar) unable to find
		// it, still on the egress network.
		if err := e.removeAgent(ctx); err != nil {
			return fmt.Errorf("%w (environment kept: close again)", err)
		}
	}
	// A created agent and the sidecar go concurrently: container removal dominates
	// close. A close by name finds a created agent without the sidecar.
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if e.agentOwned {
			errs[0] = e.removeAgent(ctx)
		}
	}()
	go func() {
		defer wg.Done()
		errs[1] = e.removeSidecar(ctx)
	}()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		// The task network and the state directory stay while a container does: a later
		// close looks the environment up through them (the sidecar's network).
		return err
	}
	if err := e.removeNetwork(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(string(e.dir)); err != nil {
		errs = append(errs, fmt.Errorf("state: %w", err))
	}
	return errors.Join(errs...)
}

// sidecarStopGrace is how long the sidecar has to exit on SIGTERM at an environment's
// close before the engine kills it. The proxy writes its batched log lines as soon as
// the signal comes, and each later one at once. It exits sooner once its tunnels end,
// as they usually do when the agent is removed at the same time; an attached agent
// keeps its sockets, and its open tunnels hold the sidecar for the whole grace.
const sidecarStopGrace = 1 // seconds, the engine's unit

// removeSidecar stops the sidecar, so that no decision line it has logged is lost,
// then removes it. A failed stop still removes it.
func (e *Env) removeSidecar(ctx context.Context) error {
	grace := sidecarStopGrace
	err := e.p.api.ContainerStop(ctx, e.names.Sidecar, container.StopOptions{Timeout: &grace})
	if cerrdefs.IsNotFound(err) {
		return nil
	}
	if err := e.p.removeContainer(ctx, e.names.Sidecar); err != nil {
		return fmt.Errorf("docker: remove sidecar: %w", err)
	}
	return nil
}

func (e *Env) removeAgent(ctx context.Context) error {
	if e.agentRef == "" {
		return nil
	}
	if e.agentOwned {
		if err := e.p.removeContainer(ctx, e.agentRef); err != nil {
			return fmt.Errorf("docker: remove agent: %w", err)
		}
		return nil
	}
	nets := []string{e.names.Network, e.egressNet}
	ci, err := e.p.api.ContainerInspect(ctx, e.agentRef)
	if cerrdefs.IsNotFound(err) {
		return nil
	}
	if err == nil {
		// Whatever it is on now, not what this process would expect it to be on.
		nets = otherNetworks(ci)
	}
	var errs []error
	for _, net := range nets {
		if err := e.p.api.NetworkDisconnect(ctx, net, e.agentRef, true); err != nil && !ignorableDisconnect(err) {
			errs = append(errs, fmt.Errorf("docker: detach agent from %s: %w", net, err))
		}
	}
	return errors.Join(errs...)
}

func ignorableDisconnect(err error) bool {
	return cerrdefs.IsNotFound(err) || containsAny(err.Error(), "is not connected", "not found", "No such")
}

// RemoveTask removes whatever exists of a task's environment of a role, however far its
// open got: through the sidecar when there is one, else by name (RemoveByName). Names
// are ambiguous (see LookupTask), so a task network or agent container whose labels
// name another task, role or owner is refused, not removed. It holds the open lock: an
// open of that name in flight is not torn down half-way.
func (p *Provider) RemoveTask(ctx context.Context, task string, role lifecycle.Role) error {
	if role == "" {
		role = lifecycle.RoleAgent
	}
	n := namesFor(EnvID(task, role))
	unlock, err := p.lockOpen(ctx, n.Env)
	if err != nil {
		return err
	}
	defer unlock()
	e, err := p.LookupTask(ctx, task, role)
	switch {
	case errors.Is(err, ErrNoEnvironment):
	case err != nil:
		return err
	default:
		return e.Close(ctx, false)
	}
	ni, err := p.api.NetworkInspect(ctx, n.Network, network.InspectOptions{})
	switch {
	case err == nil:
		if err := p.checkOwned(ni.Labels, task, role); err != nil {
			return fmt.Errorf("docker: task network %s: %w", n.Network, err)
		}
	case !cerrdefs.IsNotFound(err):
		return fmt.Errorf("docker: inspect task network %s: %w", n.Network, err)
	}
	ci, err := p.api.ContainerInspect(ctx, n.Agent)
	switch {
	case err == nil:
		// Only a container with this controller's labels is removed by name at all.
		if ci.Config != nil && ci.Config.Labels[labelManaged] == "true" && ci.Config.Labels[labelOwner] == p.cfg.Owner {
			if err := p.checkOwned(ci.Config.Labels, task, role); err != nil {
				return fmt.Errorf("docker: agent %s: %w", n.Agent, err)
			}
		}
	case !cerrdefs.IsNotFound(err):
		return fmt.Errorf("docker: inspect agent %s: %w", n.Agent, err)
	}
	return p.RemoveByName(ctx, n.Env)
}

// checkOwned refuses an object whose labels say it is not this controller's object of
// the task's environment of that role.
func (p *Provider) checkOwned(l map[string]string, task string, role lifecycle.Role) error {
	got := lifecycle.Role(l[labelEnvRole])
	if got == "" {
		got = lifecycle.RoleAgent
	}
	switch {
	case l[labelManaged] != "true" || l[labelOwner] != p.cfg.Owner:
		return fmt.Errorf("not managed by this controller (owner %q); nothing removed", l[labelOwner])
	case l[labelTask] != task || got != role:
		return fmt.Errorf("belongs to task %q (%s environment), not to task %q (%s environment); nothing removed", l[labelTask], got, task, role)
	}
	return nil
}

// RemoveByName removes whatever is left of an environment whose sidecar is gone (a
// half-finished open, or a second close): its network, its state directory, and an
// agent container only if it carries this controller's labels.
func (p *Provider) RemoveByName(ctx context.Context, env string) error {
	n := namesFor(env)
	e := &Env{p: p, names: n, dir: stateDir(filepath.Join(p.cfg.StateDir, env)), egressNet: p.cfg.EgressNetwork}
	if ci, err := p.api.ContainerInspect(ctx, n.Agent); err == nil && ci.Config != nil &&
		ci.Config.Labels[labelManaged] == "true" && ci.Config.Labels[labelOwner] == p.cfg.Owner {
		e.agentRef, e.agentOwned = n.Agent, true
	}
	return e.remove(ctx)
}

// TransparentLink is the spec of the environment's transparent path (restricted modes).
func (e *Env) TransparentLink() egresslink.Spec { return e.link }
