package dockerenv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/e2e/harness"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// The sidecar runs as the image's numeric non-root user, and its HEALTHCHECK
// (`compass-proxy healthcheck`, as that user, against the admin socket the controller
// bind-mounts) reports it healthy: the permissions of the socket's directory on the
// host are what only a real container shows.
func TestSidecarHealthyAsItsUser(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 2*time.Minute)
	e := h.Open(t, h.Provider(t), "health", policy.NoNetwork)
	var ci container.InspectResponse
	for {
		var err error
		if ci, err = h.Docker.ContainerInspect(ctx, e.SidecarContainer()); err != nil {
			t.Fatalf("inspect sidecar: %v", err)
		}
		if ci.State == nil || ci.State.Health == nil {
			t.Fatalf("the sidecar has no health state: its image's HEALTHCHECK was lost")
		}
		if ci.State.Health.Status == container.Healthy {
			break
		}
		if ci.State.Health.Status == container.Unhealthy {
			t.Fatalf("sidecar unhealthy: %+v", ci.State.Health.Log)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("sidecar not healthy before the deadline: %s %+v", ci.State.Health.Status, ci.State.Health.Log)
		case <-time.After(500 * time.Millisecond):
		}
	}
	if ci.Config.User != "65532:65532" {
		t.Errorf("sidecar user %q, want 65532:65532", ci.Config.User)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", ci.State.Pid))
	if err != nil {
		t.Fatalf("the sidecar's process: %v", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "Uid:") && strings.Fields(line)[1] != "65532" {
			t.Errorf("the sidecar's process runs as %q, want uid 65532", line)
		}
	}
}

// An open whose agent image the engine does not have fails (nothing is pulled) and
// removes what it made before the failure: no container, network or state directory of
// the task is left.
func TestFailedOpenLeavesNothing(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 2*time.Minute)
	task := h.Name("absent")
	if _, err := h.Provider(t).OpenEnv(ctx, controller.EnvSpec{Task: task, Image: task + ":none", Baseline: policy.NoNetwork}); err == nil {
		t.Fatal("an open with an image the engine does not have succeeded")
	}
	left, err := h.Leftovers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range left {
		if strings.Contains(l, task) {
			t.Errorf("the failed open left %s", l)
		}
	}
	dir := filepath.Join(h.StateDir, docker.EnvID(task, lifecycle.RoleAgent))
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the failed open left its state directory %s (%v)", dir, err)
	}
}

// Two opens of one task at once, on the real engine: exactly one succeeds, the other
// says the environment exists and removes nothing of the winner's, which stays in force.
func TestConcurrentOpensOfOneTask(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 3*time.Minute)
	p := h.Provider(t)
	spec := controller.EnvSpec{Task: h.Name("dup"), Image: h.ProbeImage, Baseline: policy.NoNetwork}
	envs := make([]*docker.Env, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range envs {
		wg.Go(func() { envs[i], errs[i] = p.OpenEnv(ctx, spec) })
	}
	wg.Wait()
	won := 0
	if errs[0] != nil {
		won = 1
	}
	if envs[won] != nil {
		t.Cleanup(func() {
			if err := envs[won].Close(context.Background(), false); err != nil {
				t.Errorf("close: %v", err)
			}
		})
	}
	if errs[won] != nil || errs[1-won] == nil || !strings.Contains(errs[1-won].Error(), "already exists") {
		t.Fatalf("opens: %v, %v; want one success and one saying the environment exists", errs[0], errs[1])
	}
	assertState(t, envs[won], policy.ModeNoNetwork)
}

// A pool with room for one task network: the second open fails naming the exhausted
// pool and leaves nothing; once the first environment is closed its subnet serves the
// next open.
func TestPoolExhaustion(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 3*time.Minute)
	used, err := h.Docker.NetworkList(ctx, network.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// One /28 of 10.214.0.0/16 that no network on the engine overlaps.
	var pool netip.Prefix
	for start, i := rand.IntN(4096), 0; i < 4096 && !pool.IsValid(); i++ {
		n := (start + i) % 4096
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 214, byte(n >> 4), byte(n&15) << 4}), 28)
		pool = p
		for _, nw := range used {
			for _, c := range nw.IPAM.Config {
				if q, err := netip.ParsePrefix(c.Subnet); err == nil && q.Overlaps(p) {
					pool = netip.Prefix{}
				}
			}
		}
	}
	cfg := h.Config()
	cfg.Pool, cfg.SubnetBits = pool, 28
	p, err := docker.New(h.Docker, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	first, err := p.OpenEnv(ctx, controller.EnvSpec{Task: h.Name("pool1"), Image: h.ProbeImage, Baseline: policy.NoNetwork})
	if err != nil {
		t.Fatalf("first open: %v", err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = first.Close(context.Background(), false)
		}
	})

	second := h.Name("pool2")
	_, err = p.OpenEnv(ctx, controller.EnvSpec{Task: second, Image: h.ProbeImage, Baseline: policy.NoNetwork})
	if !errors.Is(err, docker.ErrPoolExhausted) || !strings.Contains(err.Error(), pool.String()) {
		t.Fatalf("second open in a full pool: %v; want %v naming %s", err, docker.ErrPoolExhausted, pool)
	}
	left, err := h.Leftovers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range left {
		if strings.Contains(l, second) {
			t.Errorf("the refused open left %s", l)
		}
	}
	if _, err := os.Stat(filepath.Join(h.StateDir, docker.EnvID(second, lifecycle.RoleAgent))); !os.IsNotExist(err) {
		t.Errorf("the refused open left its state directory (%v)", err)
	}

	closed = true
	if err := first.Close(ctx, false); err != nil {
		t.Fatalf("close the first: %v", err)
	}
	again := h.Open(t, p, "pool3", policy.NoNetwork)
	if !pool.Contains(again.SidecarAddr()) {
		t.Errorf("the open after the close got sidecar %s, outside the pool %s", again.SidecarAddr(), pool)
	}
	assertState(t, again, policy.ModeNoNetwork)
}

// The image's HEALTHCHECK fails a sidecar that would route: with IPv4 forwarding on in
// its namespace it turns unhealthy, naming the sysctl, where the same container with
// forwarding off turns healthy.
func TestSidecarUnhealthyWhenForwarding(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 2*time.Minute)
	for _, forward := range []string{"0", "1"} {
		t.Run("ip_forward="+forward, func(t *testing.T) {
			name := h.Name("fwd" + forward)
			_, err := h.Docker.ContainerCreate(ctx,
				&container.Config{Image: h.ProxyImage, Labels: map[string]string{harness.OwnerLabel: h.Owner},
					Cmd: []string{"--listen", "127.0.0.1:3128", "--dns-listen", "127.0.0.1:5353",
						"--dns-upstream", "127.0.0.1:53", "--admin-socket", "/run/compass/admin.sock"},
					// The image's test command, run every second, unhealthy at its first failure.
					Healthcheck: &container.HealthConfig{Interval: time.Second, Retries: 1}},
				&container.HostConfig{NetworkMode: "none",
					Sysctls: map[string]string{"net.ipv4.ip_forward": forward, "net.ipv6.conf.all.forwarding": "0"},
					Tmpfs:   map[string]string{"/run/compass": "uid=65532,gid=65532,mode=0700"}},
				nil, nil, name)
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			t.Cleanup(func() {
				_ = h.Docker.ContainerRemove(context.Background(), name, container.RemoveOptions{Force: true})
			})
			if err := h.Docker.ContainerStart(ctx, name, container.StartOptions{}); err != nil {
				t.Fatalf("start: %v", err)
			}
			var ci container.InspectResponse
			for {
				if ci, err = h.Docker.ContainerInspect(ctx, name); err != nil {
					t.Fatal(err)
				}
				if !ci.State.Running {
					t.Fatalf("the sidecar exited: %+v", ci.State)
				}
				if ci.State.Health != nil && ci.State.Health.Status != container.Starting {
					break
				}
				select {
				case <-ctx.Done():
					t.Fatalf("no health verdict before the deadline: %+v", ci.State)
				case <-time.After(200 * time.Millisecond):
				}
			}
			want := container.Healthy
			if forward == "1" {
				want = container.Unhealthy
			}
			var log []string
			for _, r := range ci.State.Health.Log {
				log = append(log, strings.TrimSpace(r.Output))
			}
			if ci.State.Health.Status != want {
				t.Fatalf("health %s, want %s: %q", ci.State.Health.Status, want, log)
			}
			if forward == "1" && !strings.Contains(strings.Join(log, "\n"), "ip_forward is 1") {
				t.Errorf("the failing check does not say why: %q", log)
			}
		})
	}
}

// Under public the sidecar still refuses to be its own upstream: its listening address
// on the task network and its loopback, whatever the port, are internal to it (docs/proxy.md, "The internal-address guard"),
// while the fake internet answers through it.
func TestSidecarRefusesItsOwnAddresses(t *testing.T) {
	h.Need(t)
	t.Parallel()
	e := h.Open(t, h.Provider(t), "ownaddr", policy.Public)
	proxy := netip.AddrPortFrom(e.SidecarAddr(), 3128).String()
	checks := []harness.Check{{Name: "control", Kind: "proxy", Target: "allowed.test:443", Proxy: proxy}}
	for _, target := range []string{
		netip.AddrPortFrom(e.SidecarAddr(), 3128).String(),
		netip.AddrPortFrom(e.SidecarAddr(), 53).String(),
		"127.0.0.1:3128",
		"[::1]:3128",
	} {
		checks = append(checks, harness.Check{Name: target, Kind: "proxy", Target: target, Proxy: proxy})
	}
	res, err := h.ExecProbe(timeout(t, 2*time.Minute), e.AgentContainer(), checks)
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	if !res["control"].Reachable {
		t.Fatalf("public: the fake internet fails through the sidecar: %s", res["control"].Detail)
	}
	for _, c := range checks[1:] {
		if r := res[c.Name]; r.Reachable || !strings.Contains(r.Detail, "403") {
			t.Errorf("public: CONNECT %s through the sidecar: %s, want 403", c.Name, r.Detail)
		}
	}
}
