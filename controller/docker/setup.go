package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy"
)

// setUp builds one environment: networks, sidecar, agent (created, or the attached
// container attachID moved onto the task network), then applies the baseline. On error
// everything it created is removed.
func (p *Provider) setUp(ctx context.Context, spec controller.EnvSpec, attachID string) (e *Env, err error) {
	if err := ValidateTask(spec.Task); err != nil {
		return nil, err
	}
	// Checked before anything is created: an open refused for its input changes nothing.
	if !spec.Baseline.Mode.Valid() {
		return nil, fmt.Errorf("docker: open: baseline policy mode %q: the baseline is missing or invalid", spec.Baseline.Mode)
	}
	n := namesFor(EnvID(spec.Task, spec.Role))
	unlock, err := p.lockOpen(ctx, n.Env)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := p.refuseOpen(ctx, n); err != nil {
		return nil, err
	}
	egress, err := p.ensureEgressNetwork(ctx)
	if err != nil {
		return nil, err
	}
	timeout := spec.ProxyStartTimeout
	if timeout <= 0 {
		timeout = defaultProxyTimeout
	}

	e = &Env{p: p, names: n, task: spec.Task, role: spec.Role, dir: stateDir(filepath.Join(p.cfg.StateDir, n.Env)), agentOwned: attachID == ""}
	e.admin = p.adminFor(e.dir.socket())
	e.egressNet = egress.Name
	var made created
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if cerr := e.rollback(cctx, made); cerr != nil {
				err = fmt.Errorf("%w (and cleanup failed: %v)", err, cerr)
			}
		}
	}()
	if _, serr := os.Stat(string(e.dir)); errors.Is(serr, fs.ErrNotExist) {
		made.dir = true
	}
	if err := e.dir.create(); err != nil {
		return e, err
	}
	plan, err := p.createTaskNetwork(ctx, n, p.labels(n, spec.Task, spec.Role, roleNetwork))
	// An error but a name conflict may be an answer lost after the engine made it (a
	// timeout, Ctrl-C): under the open lock, only this open can have.
	made.network = !isNameConflict(err)
	if err != nil {
		return e, err
	}
	e.plan = plan
	if err := e.loadLink(); err != nil {
		return e, err
	}

	if err := p.startContainers(ctx, e, spec, attachID, timeout, &made); err != nil {
		return e, err
	}
	if _, err := e.Apply(ctx, spec.Baseline, controller.PhaseLabel{Phase: string(policy.PhaseBaseline)}); err != nil {
		return e, err
	}
	return e, nil
}

// refuseOpen refuses, before anything is made, an open that would fail for what exists
// (the environment) or is missing (the proxy image): such an open changes nothing.
func (p *Provider) refuseOpen(ctx context.Context, n names) error {
	if _, ierr := p.api.ContainerInspect(ctx, n.Sidecar); ierr == nil {
		return fmt.Errorf("docker: environment %s already exists (close it first)", n.Env)
	}
	if _, ierr := p.api.ImageInspect(ctx, p.cfg.ProxyImage); ierr != nil {
		if cerrdefs.IsNotFound(ierr) {
			return fmt.Errorf("docker: proxy image %s is missing: run `compassctl env image build` (or `image load FILE` on an air-gapped host)", p.cfg.ProxyImage)
		}
		return fmt.Errorf("docker: inspect proxy image %s: %w", p.cfg.ProxyImage, ierr)
	}
	return nil
}

// startContainers starts the sidecar and waits for it to be ready, then starts the agent
// (created meanwhile), or moves the attached container attachID onto the task network.
// made records what it created, for setUp's rollback.
func (p *Provider) startContainers(ctx context.Context, e *Env, spec controller.EnvSpec, attachID string, timeout time.Duration, made *created) error {
	agentRef := e.names.Agent
	if attachID != "" {
		agentRef = attachID
	}
	e.agentRef = agentRef
	// The agent container is created while the sidecar starts (its address is fixed by
	// the subnet plan), and started only once the sidecar is ready.
	type creation struct {
		made bool
		err  error
	}
	agentCreated := make(chan creation, 1)
	if attachID == "" {
		go func() {
			ok, err := p.createAgent(ctx, e, spec)
			agentCreated <- creation{ok, err}
		}()
	} else {
		agentCreated <- creation{}
	}
	var err error
	made.sidecar, err = p.createSidecar(ctx, e, agentRef)
	if err == nil {
		err = e.waitReady(ctx, timeout)
	}
	ac := <-agentCreated
	made.agent = ac.made
	if err == nil {
		err = ac.err
	}
	if err != nil {
		return err
	}
	if attachID == "" {
		if err := p.api.ContainerStart(ctx, e.names.Agent, container.StartOptions{}); err != nil {
			return fmt.Errorf("docker: start agent %s: %w", e.names.Agent, err)
		}
	} else if err := p.moveAgent(ctx, e, attachID, &made.moved); err != nil {
		return err
	}
	return nil
}

// labelEgressNet, on the sidecar, names the egress network the environment was opened
// with: a later process may be configured with another, and must still cut this one.
const labelEgressNet = "compass-egress.egress-network"

func (p *Provider) proxyArgs(e *Env) []string {
	args := []string{
		"--listen", netip.AddrPortFrom(e.plan.Sidecar, proxyPort).String(),
		"--dns-listen", netip.AddrPortFrom(e.plan.Sidecar, dnsPort).String(),
		"--transparent-listen", fmt.Sprintf(":%d", transparentPort),
		"--admin-socket", "/run/compass/admin.sock",
		"--task", e.task,
		"--phase", "start",
	}
	for _, u := range p.cfg.DNSUpstreams {
		args = append(args, "--dns-upstream", u)
	}
	return append(args, p.cfg.ExtraProxyArg...)
}

// created is what one setUp made, and so what its rollback may remove: a concurrent or
// earlier open may own an object of the same name.
type created struct {
	dir, network, sidecar, agent bool
	moved                        bool // the attached container was put on the task network
}

// rollback removes what setUp made. A moved attached container is left on no network,
// as close leaves it.
func (e *Env) rollback(ctx context.Context, m created) error {
	var errs []error
	switch {
	case m.agent || m.moved:
		errs = append(errs, e.removeAgent(ctx))
	case !e.agentOwned && e.agentRef != "" && m.network:
		// A connect whose answer was lost may still have put the attached container on
		// the task network: it leaves that one, and keeps its own.
		if err := e.p.api.NetworkDisconnect(ctx, e.names.Network, e.agentRef, true); err != nil && !ignorableDisconnect(err) {
			errs = append(errs, fmt.Errorf("docker: detach %s from %s: %w", e.agentRef, e.names.Network, err))
		}
	}
	if m.sidecar {
		if err := e.p.removeContainer(ctx, e.names.Sidecar); err != nil {
			errs = append(errs, fmt.Errorf("docker: remove sidecar: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		// The task network and the state directory stay while a container does: close
		// looks the environment up through them.
		return err
	}
	if m.network {
		errs = append(errs, e.removeNetwork(ctx))
	}
	if m.dir {
		if err := os.RemoveAll(string(e.dir)); err != nil {
			errs = append(errs, fmt.Errorf("state: %w", err))
		}
	}
	return errors.Join(errs...)
}

// isNameConflict reports the engine's refusal of a name another object holds: the only
// create error that proves the create made nothing (nil is no refusal).
func isNameConflict(err error) bool {
	return err != nil && (cerrdefs.IsConflict(err) || isAlreadyExists(err))
}

// lockOpen serialises opens of one environment across processes, so that two opens of
// a task never both pass the existence check. The lock files live apart from the
// environment directories, which a failed open or a close removes.
func (p *Provider) lockOpen(ctx context.Context, env string) (unlock func(), err error) {
	dir := filepath.Join(p.cfg.StateDir, ".open-locks")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("state: open lock: %w", err)
	}
	return flock(ctx, filepath.Join(dir, env), nil)
}

// createSidecar reports whether it created the container, even when a later step fails.
func (p *Provider) createSidecar(ctx context.Context, e *Env, agentRef string) (bool, error) {
	labels := p.labels(e.names, e.task, e.role, roleSidecar)
	labels[labelAgent] = agentRef
	labels[labelAgentOwned] = strconv.FormatBool(e.agentOwned)
	labels[labelEgressNet] = e.egressNet
	var env []string
	for k, v := range p.cfg.ProxyEnv {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	_, err := p.api.ContainerCreate(ctx,
		&container.Config{Image: p.cfg.ProxyImage, Cmd: p.proxyArgs(e), Labels: labels, Env: env},
		&container.HostConfig{
			NetworkMode: container.NetworkMode(e.egressNet),
			Sysctls: map[string]string{
				// Binding :53 as the image's unprivileged user.
				"net.ipv4.ip_unprivileged_port_start": "0",
				// A forwarding sidecar would be a router out of the sandbox.
				"net.ipv4.ip_forward":          "0",
				"net.ipv6.conf.all.forwarding": "0",
				// Strict reverse-path filtering: a datagram whose source does not route
				// back through the interface it came in on is dropped. A container on
				// the task network that can write its packets' source (NET_RAW, kept by
				// attached containers) would otherwise have the DNS server's refusal,
				// which echoes the query's name, sent out to any address it names.
				"net.ipv4.conf.all.rp_filter":     "1",
				"net.ipv4.conf.default.rp_filter": "1",
			},
			Mounts:    []mount.Mount{{Type: mount.TypeBind, Source: e.dir.admin(), Target: "/run/compass"}},
			LogConfig: container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": "10m", "max-file": "2"}},
		},
		nil, nil, e.names.Sidecar)
	if err != nil {
		// setUp saw no sidecar of this name, under the open lock: unless the engine says
		// the name is taken, the create may have happened with its answer lost.
		return !isNameConflict(err), fmt.Errorf("docker: create sidecar %s: %w", e.names.Sidecar, err)
	}
	err = p.api.NetworkConnect(ctx, e.names.Network, e.names.Sidecar, &network.EndpointSettings{
		IPAMConfig: &network.EndpointIPAMConfig{IPv4Address: e.plan.Sidecar.String()},
	})
	if err != nil {
		return true, fmt.Errorf("docker: connect sidecar to %s: %w", e.names.Network, err)
	}
	if err := p.api.ContainerStart(ctx, e.names.Sidecar, container.StartOptions{}); err != nil {
		return true, fmt.Errorf("docker: start sidecar %s: %w", e.names.Sidecar, err)
	}
	return true, nil
}

// proxyEnv is what the agent's tools read to find the proxy.
func proxyEnv(plan subnetPlan) map[string]string {
	u := "http://" + netip.AddrPortFrom(plan.Sidecar, proxyPort).String()
	no := "localhost,127.0.0.1,::1"
	return map[string]string{
		"HTTP_PROXY": u, "HTTPS_PROXY": u, "NO_PROXY": no,
		"http_proxy": u, "https_proxy": u, "no_proxy": no,
	}
}

func envList(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// createAgent reports whether the container may exist by its doing, even on error.
func (p *Provider) createAgent(ctx context.Context, e *Env, spec controller.EnvSpec) (bool, error) {
	env := proxyEnv(e.plan)
	for k, v := range spec.Env {
		env[k] = v
	}
	// Docker's embedded resolver (127.0.0.11) does not forward on an internal network,
	// so the agent gets a resolv.conf naming the sidecar directly.
	resolv, err := e.dir.writeResolvConf(e.plan.Sidecar)
	if err != nil {
		return false, err
	}
	_, err = p.api.ContainerCreate(ctx,
		&container.Config{Image: spec.Image, Cmd: spec.Cmd, Env: envList(env), Labels: p.labels(e.names, e.task, e.role, roleAgent)},
		&container.HostConfig{
			NetworkMode: container.NetworkMode(e.names.Network),
			DNS:         []string{e.plan.Sidecar.String()},
			Mounts:      []mount.Mount{{Type: mount.TypeBind, Source: resolv, Target: "/etc/resolv.conf", ReadOnly: true}},
			// Raw sockets would let the agent hand-build frames past its own stack: IPv6
			// to the host bridge's link-local address (the host answers there), or
			// spoofed neighbour answers on the task network.
			CapDrop: []string{"NET_RAW"},
		},
		&network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{
			e.names.Network: {IPAMConfig: &network.EndpointIPAMConfig{IPv4Address: e.plan.Agent.String()}},
		}},
		nil, e.names.Agent)
	if err != nil {
		// Unless the engine says the name is taken, the create may have happened with
		// its answer lost.
		return !isNameConflict(err), fmt.Errorf("docker: create agent %s: %w", e.names.Agent, err)
	}
	return true, nil
}

// moveAgent puts an attached container on the task network and takes it off every
// other network (each of which may lead out). It sets moved once the container is on
// the task network.
func (p *Provider) moveAgent(ctx context.Context, e *Env, id string, moved *bool) error {
	err := p.api.NetworkConnect(ctx, e.names.Network, id, &network.EndpointSettings{
		IPAMConfig: &network.EndpointIPAMConfig{IPv4Address: e.plan.Agent.String()},
	})
	if err != nil {
		return fmt.Errorf("docker: attach: connect %s to %s: %w", id, e.names.Network, err)
	}
	*moved = true
	ci, err := p.api.ContainerInspect(ctx, id)
	if err != nil {
		return fmt.Errorf("docker: attach: inspect %s: %w", id, err)
	}
	for name := range ci.NetworkSettings.Networks {
		if name == e.names.Network {
			continue
		}
		if err := p.api.NetworkDisconnect(ctx, name, id, true); err != nil {
			return fmt.Errorf("docker: attach: disconnect %s from %s: %w", id, name, err)
		}
	}
	return nil
}

// waitReady polls the sidecar's readiness over its admin socket until timeout, failing
// early with the sidecar's last log lines if it exits.
func (e *Env) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var lastErr error
	for {
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		lastErr = e.admin.Ready(rctx)
		rcancel()
		if lastErr == nil {
			return nil
		}
		ci, err := e.p.api.ContainerInspect(ctx, e.names.Sidecar)
		if err == nil && ci.State != nil && !ci.State.Running {
			return fmt.Errorf("docker: sidecar %s exited (code %d) before becoming ready: %s", e.names.Sidecar, ci.State.ExitCode, e.p.logTail(context.WithoutCancel(ctx), e.names.Sidecar))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("docker: sidecar %s not ready within %s (last check: %v): %s", e.names.Sidecar, timeout, lastErr, e.p.logTail(context.WithoutCancel(ctx), e.names.Sidecar))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// logTail returns the last lines a container wrote, for error messages.
func (p *Provider) logTail(ctx context.Context, ref string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rc, err := p.api.ContainerLogs(ctx, ref, container.LogsOptions{ShowStdout: true, ShowStderr: true, Tail: "5"})
	if err != nil {
		return "no logs: " + err.Error()
	}
	defer rc.Close()
	var out, errb strings.Builder
	if _, err := stdcopy.StdCopy(&out, &errb, io.LimitReader(rc, 8192)); err != nil {
		return "no logs: " + err.Error()
	}
	s := strings.TrimSpace(errb.String() + out.String())
	if s == "" {
		return "no log output"
	}
	return "logs: " + s
}
