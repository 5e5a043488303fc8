// Package docker is the Docker provider: it wires each environment so that the policy
// in force is the only way out (a per-task internal network, a dual-homed compass-proxy
// sidecar, the agent's default routes removed), switches that policy at each phase
// boundary without restarting anything, and checks the result from inside the sandbox.
package docker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// Provider opens and finds Docker environments.
type Provider struct {
	api    dockerAPI
	cfg    Config
	routes routeTable
	link   transparentLink
	log    *slog.Logger
	// adminTransport, if set, wraps the transport of every admin client (tests: to
	// stop the world between two steps of a switch).
	adminTransport func(http.RoundTripper) http.RoundTripper
}

var _ controller.Provider = (*Provider)(nil)

// New returns a provider over api (a *client.Client from NewClient, or a fake).
func New(api dockerAPI, cfg Config, log *slog.Logger) (*Provider, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Provider{api: api, cfg: cfg, routes: netlinkRoutes{}, link: kernelLink{}, log: log}, nil
}

// adminFor is the admin client of one sidecar's socket.
func (p *Provider) adminFor(socket string) *adminapi.Client {
	return adminapi.NewClient(socket, p.adminTransport)
}

// Name is the provider's name in plans and errors.
func (p *Provider) Name() string { return "docker" }

// Config returns the provider's configuration with defaults filled in.
func (p *Provider) Config() Config { return p.cfg }

// EnvID is the environment name of a task's environment of the given role.
func EnvID(task string, role lifecycle.Role) string {
	if role == lifecycle.RoleEvaluation {
		return task + "-eval"
	}
	return task
}

func (p *Provider) labels(n names, task string, role lifecycle.Role, objRole string) map[string]string {
	return map[string]string{
		labelManaged:     "true",
		labelOwner:       p.cfg.Owner,
		labelEnv:         n.Env,
		labelTask:        task,
		labelEnvRole:     string(role),
		labelRole:        objRole,
		labelCreatedUnix: strconv.FormatInt(p.cfg.Clock.Now().Unix(), 10),
	}
}

// bridgeICC is the bridge driver's option for traffic between containers on the same
// network. The egress network is shared by every task's sidecar and every public-mode
// agent, and none of them has anything to say to another there (an agent reaches its
// sidecar on its task network), so it is off: a sidecar cannot be used to reach
// another task's agent, nor one task's agent another's.
const bridgeICC = "com.docker.network.bridge.enable_icc"

// ensureEgressNetwork creates the shared egress network unless it exists. Concurrent
// opens race here: Docker refuses the duplicate name, and the loser uses the winner's.
func (p *Provider) ensureEgressNetwork(ctx context.Context) (network.Inspect, error) {
	ni, err := p.api.NetworkInspect(ctx, p.cfg.EgressNetwork, network.InspectOptions{})
	if err == nil {
		if ni.Internal {
			return ni, fmt.Errorf("docker: egress network %s is internal: it has no way out", p.cfg.EgressNetwork)
		}
		if iccOn(ni.Options) {
			p.log.Warn("egress network lets its containers reach each other; see compassctl env doctor", "network", p.cfg.EgressNetwork)
		}
		return ni, nil
	}
	if !cerrdefs.IsNotFound(err) {
		return ni, fmt.Errorf("docker: inspect egress network %s: %w", p.cfg.EgressNetwork, err)
	}
	_, cerr := p.api.NetworkCreate(ctx, p.cfg.EgressNetwork, network.CreateOptions{
		Driver:  "bridge",
		Options: map[string]string{bridgeICC: "false"},
		Labels:  map[string]string{labelManaged: "true", labelOwner: p.cfg.Owner, labelRole: roleEgress},
	})
	if cerr != nil && !cerrdefs.IsConflict(cerr) && !isAlreadyExists(cerr) {
		return ni, fmt.Errorf("docker: create egress network %s: %w", p.cfg.EgressNetwork, cerr)
	}
	ni, err = p.api.NetworkInspect(ctx, p.cfg.EgressNetwork, network.InspectOptions{})
	if err != nil {
		return ni, fmt.Errorf("docker: inspect egress network %s: %w", p.cfg.EgressNetwork, err)
	}
	return ni, nil
}

func isAlreadyExists(err error) bool {
	return err != nil && (cerrdefs.IsAlreadyExists(err) || containsAny(err.Error(), "already exists"))
}

// Open creates the environment with spec.Baseline in force, or removes what it created.
func (p *Provider) Open(ctx context.Context, spec controller.EnvSpec) (controller.Environment, error) {
	e, err := p.OpenEnv(ctx, spec)
	if err != nil {
		return nil, err
	}
	return e, nil
}

// OpenEnv is Open returning the concrete environment.
func (p *Provider) OpenEnv(ctx context.Context, spec controller.EnvSpec) (*Env, error) {
	if spec.Role == "" {
		spec.Role = lifecycle.RoleAgent
	}
	if spec.Image == "" {
		return nil, errors.New("docker: open: an image is required")
	}
	return p.setUp(ctx, spec, "")
}

// Attach brings a running container someone else created under control: it gets a
// sidecar and a task network, is moved off every other network, and baseline is applied.
// Containers on network mode none, host or container:<id> are refused (they cannot be
// rewired per phase).
func (p *Provider) Attach(ctx context.Context, spec controller.EnvSpec, containerRef string) (*Env, error) {
	if spec.Role == "" {
		spec.Role = lifecycle.RoleAgent
	}
	ci, err := p.api.ContainerInspect(ctx, containerRef)
	if err != nil {
		return nil, fmt.Errorf("docker: attach: inspect %s: %w", containerRef, err)
	}
	if err := attachable(ci); err != nil {
		return nil, err
	}
	if err := p.notControlled(ctx, ci); err != nil {
		return nil, err
	}
	return p.setUp(ctx, spec, ci.ID)
}

// notControlled refuses a container some environment already controls (whatever its
// owner): a compass-egress container, or one attached to another environment. That
// environment's switches and close would rewire it behind this one's back.
func (p *Provider) notControlled(ctx context.Context, ci container.InspectResponse) error {
	if ci.Config != nil && ci.Config.Labels[labelManaged] == "true" {
		l := ci.Config.Labels
		return fmt.Errorf("%w: %s is the %s of environment %s (owner %q)", ErrNotAttachable, ci.Name, l[labelRole], l[labelEnv], l[labelOwner])
	}
	f := filters.NewArgs(
		filters.Arg("label", labelManaged+"=true"),
		filters.Arg("label", labelRole+"="+roleSidecar),
		filters.Arg("label", labelAgent+"="+ci.ID),
	)
	cs, err := p.api.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		return fmt.Errorf("docker: attach: list sidecars: %w", err)
	}
	for _, c := range cs {
		if c.Labels[labelAgent] == ci.ID {
			return fmt.Errorf("%w: %s is attached to environment %s (owner %q); close that first", ErrNotAttachable, ci.Name, c.Labels[labelEnv], c.Labels[labelOwner])
		}
	}
	return nil
}

// ErrNotAttachable is returned for containers whose network mode cannot be rewired.
var ErrNotAttachable = errors.New("docker: container cannot be attached")

func attachable(ci container.InspectResponse) error {
	if ci.HostConfig == nil {
		return fmt.Errorf("%w: %s has no host config", ErrNotAttachable, ci.Name)
	}
	mode := ci.HostConfig.NetworkMode
	switch {
	case mode.IsNone():
		return fmt.Errorf("%w: %s uses network mode none: it has no network to rewire, and a dynamic policy needs one (recreate it on a bridge network)", ErrNotAttachable, ci.Name)
	case mode.IsHost():
		return fmt.Errorf("%w: %s uses network mode host: it shares the host's network, which no policy can confine (recreate it on a bridge network)", ErrNotAttachable, ci.Name)
	case mode.IsContainer():
		return fmt.Errorf("%w: %s uses network mode %s: it shares another container's namespace, which would bypass its own wiring (attach the owner of that namespace instead)", ErrNotAttachable, ci.Name, mode)
	}
	if ci.HostConfig.Privileged {
		return fmt.Errorf("%w: %s is privileged: it can reach the host's devices and undo any wiring (recreate it unprivileged)", ErrNotAttachable, ci.Name)
	}
	for _, c := range ci.HostConfig.CapAdd {
		switch strings.TrimPrefix(strings.ToUpper(c), "CAP_") {
		case "NET_ADMIN", "SYS_ADMIN", "ALL":
			return fmt.Errorf("%w: %s has capability %s: it can re-add the routes and addresses every switch removes, or delete the link that makes its sidecar its only way out (recreate it without)", ErrNotAttachable, ci.Name, c)
		}
	}
	if ci.State == nil || !ci.State.Running {
		return fmt.Errorf("%w: %s is not running", ErrNotAttachable, ci.Name)
	}
	return nil
}

// listManaged returns the sidecars (one per environment) this controller owns.
func (p *Provider) listManaged(ctx context.Context) ([]container.Summary, error) {
	f := filters.NewArgs(
		filters.Arg("label", labelManaged+"=true"),
		filters.Arg("label", labelOwner+"="+p.cfg.Owner),
		filters.Arg("label", labelRole+"="+roleSidecar),
	)
	cs, err := p.api.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		return nil, fmt.Errorf("docker: list sidecars: %w", err)
	}
	return cs, nil
}
