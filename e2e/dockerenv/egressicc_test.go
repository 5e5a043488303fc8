package dockerenv

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/e2e/harness"
	"github.com/compass-egress/compass-egress/policy"
)

// The egress network the controller creates keeps its containers apart. Every task's
// sidecar and public-mode agent shares it: a server on it is out of reach for a public
// agent directly and for a denylist agent through its sidecar. The control: on the
// harness's egress network, created without that option, the same checks reach the
// fake internet.
func TestControllerEgressNetworkKeepsContainersApart(t *testing.T) {
	h.Need(t)
	t.Parallel()
	ctx := timeout(t, 3*time.Minute)
	cfg := h.Config()
	cfg.EgressNetwork = h.Name("icc-egress")
	// Removed last (cleanups run in reverse), once the environments on it are closed; a
	// killed run's network carries the owner label and goes with the next run's sweep.
	t.Cleanup(func() { _ = h.Docker.NetworkRemove(context.Background(), cfg.EgressNetwork) })
	p, err := docker.New(h.Docker, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	public := h.Open(t, p, "icc-pub", policy.Public)
	deny := h.Open(t, p, "icc-deny", denylist)

	name := h.Name("icc-server")
	labels := map[string]string{harness.OwnerLabel: h.Owner, "compass-egress.managed": "true"}
	if _, err := h.Docker.ContainerCreate(ctx, &container.Config{Image: h.FakenetImage, Labels: labels},
		&container.HostConfig{NetworkMode: container.NetworkMode(cfg.EgressNetwork)}, nil, nil, name); err != nil {
		t.Fatalf("create server: %v", err)
	}
	t.Cleanup(func() {
		_ = h.Docker.ContainerRemove(context.Background(), name, container.RemoveOptions{Force: true})
	})
	if err := h.Docker.ContainerStart(ctx, name, container.StartOptions{}); err != nil {
		t.Fatalf("start server: %v", err)
	}
	ci, err := h.Docker.ContainerInspect(ctx, name)
	if err != nil || ci.NetworkSettings.Networks[cfg.EgressNetwork] == nil {
		t.Fatalf("inspect server: %v", err)
	}
	server, err := netip.ParseAddr(ci.NetworkSettings.Networks[cfg.EgressNetwork].IPAddress)
	if err != nil {
		t.Fatal(err)
	}

	control := h.Open(t, h.Provider(t), "icc-ctl", denylist)
	for _, tc := range []struct {
		name  string
		env   *docker.Env
		to    netip.Addr
		proxy bool
		want  bool
	}{
		{"public agent to a neighbour", public, server, false, false},
		{"denylist agent through its sidecar to a neighbour", deny, server, true, false},
		{"control: denylist agent through its sidecar to the fake internet", control, h.Fakenet, true, true},
	} {
		check := harness.Check{Name: "n", Kind: "tcp", Target: netip.AddrPortFrom(tc.to, 80).String(), TimeoutMS: 3000}
		if tc.proxy {
			check.Kind, check.Proxy = "proxy", netip.AddrPortFrom(tc.env.SidecarAddr(), 3128).String()
		}
		res, err := h.ExecProbe(ctx, tc.env.AgentContainer(), []harness.Check{check})
		if err != nil {
			t.Fatalf("%s: probe: %v", tc.name, err)
		}
		if got := res["n"].Reachable; got != tc.want {
			t.Errorf("%s: reachable %v, want %v (%s)", tc.name, got, tc.want, res["n"].Detail)
		}
	}
}
