package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/images/probe/probespec"
	"github.com/compass-egress/compass-egress/policy"
)

var seq atomic.Int64

// Name returns a unique object or task name of this run: "<prefix>-<base>-<n>".
func (h *Harness) Name(base string) string {
	return fmt.Sprintf("%s-%s-%d", h.Prefix, base, seq.Add(1))
}

// Config is the provider configuration of this package: its own owner, state
// directory, egress network, images, and the fake internet as the sidecars' resolver.
func (h *Harness) Config() docker.Config {
	return docker.Config{
		StateDir:      h.StateDir,
		EgressNetwork: h.EgressNetwork,
		ProxyImage:    h.ProxyImage,
		ProbeImage:    h.ProbeImage,
		Owner:         h.Owner,
		DNSUpstreams:  []string{netip.AddrPortFrom(h.Fakenet, 53).String()},
	}
}

// Provider returns a Docker provider over Config.
func (h *Harness) Provider(t testing.TB) *docker.Provider {
	t.Helper()
	p, err := docker.New(h.Docker, h.Config(), nil)
	if err != nil {
		t.Fatalf("provider: %v", err)
	}
	return p
}

// Open opens an environment for a new task (agent image: the probe, sleeping) with
// baseline in force, and closes it when the test ends.
func (h *Harness) Open(t testing.TB, p *docker.Provider, base string, baseline policy.Policy) *docker.Env {
	t.Helper()
	return h.OpenImage(t, p, base, baseline, h.ProbeImage)
}

// OpenImage is Open with image's default command as the agent (it must keep running).
func (h *Harness) OpenImage(t testing.TB, p *docker.Provider, base string, baseline policy.Policy, image string) *docker.Env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := p.OpenEnv(ctx, controller.EnvSpec{Task: h.Name(base), Image: image, Baseline: baseline})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := e.Close(ctx, false); err != nil {
			t.Errorf("close %s: %v", e.ID(), err)
		}
	})
	return e
}

// CompassctlEnv is the environment that points the built compassctl at this package's
// Docker objects.
func (h *Harness) CompassctlEnv() []string {
	return append(os.Environ(),
		"COMPASS_STATE_DIR="+h.StateDir,
		"COMPASS_EGRESS_NETWORK="+h.EgressNetwork,
		"COMPASS_PROXY_IMAGE="+h.ProxyImage,
		"COMPASS_PROBE_IMAGE="+h.ProbeImage,
		"COMPASS_OWNER="+h.Owner,
		"COMPASS_DNS_UPSTREAM="+netip.AddrPortFrom(h.Fakenet, 53).String(),
	)
}

// Compassctl prepares the built compassctl with args and CompassctlEnv.
func (h *Harness) Compassctl(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(h.BinDir, "compassctl"), args...)
	cmd.Env = h.CompassctlEnv()
	return cmd
}

// Check and Result are the probe's protocol (images/probe/probespec).
type (
	Check  = probespec.Check
	Result = probespec.Result
)

// ExecProbe runs `/probe check` inside a container (the agent itself: its own
// namespace, resolver and filesystem) and returns the results by check name.
func (h *Harness) ExecProbe(ctx context.Context, ctr string, checks []Check) (map[string]Result, error) {
	spec, err := json.Marshal(checks)
	if err != nil {
		return nil, err
	}
	out, err := h.Exec(ctx, ctr, "/probe", "check", string(spec))
	if err != nil {
		return nil, err
	}
	var rs []Result
	if err := json.Unmarshal(out, &rs); err != nil {
		return nil, fmt.Errorf("probe output %q: %w", out, err)
	}
	m := make(map[string]Result, len(rs))
	for _, r := range rs {
		m[r.Name] = r
	}
	return m, nil
}

// Exec runs a command in a container through the Docker API and returns its stdout;
// a non-zero exit is an error carrying stderr.
func (h *Harness) Exec(ctx context.Context, ctr string, cmd ...string) ([]byte, error) {
	created, err := h.Docker.ContainerExecCreate(ctx, ctr, container.ExecOptions{Cmd: cmd, AttachStdout: true, AttachStderr: true})
	if err != nil {
		return nil, fmt.Errorf("exec create: %w", err)
	}
	hj, err := h.Docker.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		return nil, fmt.Errorf("exec attach: %w", err)
	}
	defer hj.Close()
	var stdout, stderr bytes.Buffer
	if _, err := stdcopy.StdCopy(&stdout, &stderr, hj.Reader); err != nil {
		return nil, fmt.Errorf("exec output: %w", err)
	}
	ins, err := h.Docker.ContainerExecInspect(ctx, created.ID)
	if err != nil {
		return nil, fmt.Errorf("exec inspect: %w", err)
	}
	if ins.ExitCode != 0 {
		return stdout.Bytes(), fmt.Errorf("exec %v: exit %d: %s", cmd, ins.ExitCode, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// ProbeContainer creates a container of the probe image (which sleeps) under a new name
// from base, with hc, labelled as this package's and removed when the test ends, and
// starts it if start is set.
func (h *Harness) ProbeContainer(ctx context.Context, t testing.TB, base string, hc *container.HostConfig, start bool) string {
	t.Helper()
	return h.Container(ctx, t, base, h.ProbeImage, hc, start)
}

// Container is ProbeContainer with image (its default command must keep it running).
func (h *Harness) Container(ctx context.Context, t testing.TB, base, image string, hc *container.HostConfig, start bool) string {
	t.Helper()
	name := h.Name(base)
	if _, err := h.Docker.ContainerCreate(ctx, &container.Config{Image: image, Labels: map[string]string{OwnerLabel: h.Owner}},
		hc, nil, nil, name); err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	t.Cleanup(func() { _ = h.Docker.ContainerRemove(context.Background(), name, container.RemoveOptions{Force: true}) })
	if start {
		if err := h.Docker.ContainerStart(ctx, name, container.StartOptions{}); err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
	}
	return name
}

// Networks lists the networks a container is connected to, as docker inspect says.
func (h *Harness) Networks(ctx context.Context, ctr string) ([]string, error) {
	ci, err := h.Docker.ContainerInspect(ctx, ctr)
	if err != nil {
		return nil, err
	}
	var out []string
	for n := range ci.NetworkSettings.Networks {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// DefaultRoutes reads a container's IPv4 and IPv6 default routes with netlink in its
// network namespace, independently of the provider's own code.
func (h *Harness) DefaultRoutes(ctx context.Context, ctr string) ([]string, error) {
	var out []string
	err := h.NetlinkIn(ctx, ctr, func(nh *netlink.Handle) error {
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, err := nh.RouteList(nil, fam)
			if err != nil {
				return err
			}
			for _, r := range rs {
				if r.Dst == nil || r.Dst.IP.IsUnspecified() {
					out = append(out, fmt.Sprintf("default via %v", r.Gw))
				}
			}
		}
		return nil
	})
	return out, err
}

// NetlinkIn calls fn with a netlink handle in the network namespace of the running
// container ctr.
func (h *Harness) NetlinkIn(ctx context.Context, ctr string, fn func(*netlink.Handle) error) error {
	ci, err := h.Docker.ContainerInspect(ctx, ctr)
	if err != nil {
		return err
	}
	if ci.State == nil || ci.State.Pid == 0 {
		return fmt.Errorf("%s is not running", ctr)
	}
	ns, err := netns.GetFromPid(ci.State.Pid)
	if err != nil {
		return err
	}
	defer ns.Close()
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer nh.Close()
	return fn(nh)
}
