package dockerenv

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/e2e/harness"
	"github.com/compass-egress/compass-egress/policy"
)

const benchTasks = 50

// BenchmarkEnvLifecycle times open, switch and close over 50 tasks, one after the other,
// and prints p50 and p99 of each next to the Docker operations they are built from,
// measured in the same run (run it with -benchtime=1x: `make bench-env`).
func BenchmarkEnvLifecycle(b *testing.B) {
	h.Need(b)
	ctx := context.Background()
	p := h.Provider(b)
	samples := map[string][]time.Duration{}
	add := func(k string, d time.Duration) { samples[k] = append(samples[k], d) }
	timed := func(k string, f func() error) {
		start := time.Now()
		if err := f(); err != nil {
			b.Fatalf("%s: %v", k, err)
		}
		add(k, time.Since(start))
	}
	for i := 0; i < benchTasks; i++ {
		// Baseline: the raw Docker operations an open and a rewiring switch consist of.
		plain := h.Name("plain")
		timed("docker create+start (baseline)", func() error {
			if _, err := h.Docker.ContainerCreate(ctx, &container.Config{Image: h.ProbeImage, Labels: map[string]string{harness.OwnerLabel: h.Owner}},
				&container.HostConfig{NetworkMode: container.NetworkMode(h.EgressNetwork)}, nil, nil, plain); err != nil {
				return err
			}
			return h.Docker.ContainerStart(ctx, plain, container.StartOptions{})
		})
		if err := h.Docker.ContainerRemove(ctx, plain, container.RemoveOptions{Force: true}); err != nil {
			b.Fatal(err)
		}

		var e interface {
			Apply(context.Context, policy.Policy, controller.PhaseLabel) (controller.Transition, error)
			Close(context.Context, bool) error
			AgentContainer() string
		}
		timed("open (baseline no-network)", func() error {
			env, err := p.OpenEnv(ctx, controller.EnvSpec{Task: h.Name("bench"), Image: h.ProbeImage, Baseline: policy.NoNetwork})
			e = env
			return err
		})
		sw := func(k string, pol policy.Policy) {
			timed(k, func() error {
				_, err := e.Apply(ctx, pol, controller.PhaseLabel{Phase: "bench"})
				return err
			})
		}
		sw("switch rules only (no-network -> allowlist)", allowlist)
		sw("switch rules only (allowlist -> denylist)", denylist)
		sw("switch + rewiring (denylist -> public)", policy.Public)
		sw("switch + rewiring (public -> no-network)", policy.NoNetwork)
		timed("docker network connect (baseline)", func() error {
			return h.Docker.NetworkConnect(ctx, h.EgressNetwork, e.AgentContainer(), &network.EndpointSettings{})
		})
		timed("docker network disconnect (baseline)", func() error {
			return h.Docker.NetworkDisconnect(ctx, h.EgressNetwork, e.AgentContainer(), true)
		})
		timed("close", func() error { return e.Close(ctx, false) })
	}
	report(b, samples)
}

func pct(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s)) + 0.5)
	if i >= len(s) {
		i = len(s) - 1
	}
	if i > 0 && q < 1 && float64(i) == q*float64(len(s)) {
		i--
	}
	return s[i]
}

func report(b *testing.B, samples map[string][]time.Duration) {
	order := []struct{ key, target, baseline string }{
		{"open (baseline no-network)", "1.5s", "docker create+start (baseline)"},
		{"switch rules only (no-network -> allowlist)", "150ms", ""},
		{"switch rules only (allowlist -> denylist)", "150ms", ""},
		{"switch + rewiring (denylist -> public)", "300ms", "docker network connect (baseline)"},
		{"switch + rewiring (public -> no-network)", "300ms", "docker network disconnect (baseline)"},
		{"close", "1s", ""},
		{"docker create+start (baseline)", "", ""},
		{"docker network connect (baseline)", "", ""},
		{"docker network disconnect (baseline)", "", ""},
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "\nOPERATION (%d tasks)\tp50\tp99\tTARGET p50\tp50 / BASELINE p50\n", benchTasks)
	for _, o := range order {
		s := samples[o.key]
		p50, p99 := pct(s, 0.5), pct(s, 0.99)
		ratio := ""
		if o.baseline != "" {
			ratio = fmt.Sprintf("%.2fx %s", float64(p50)/float64(pct(samples[o.baseline], 0.5)), o.baseline)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", o.key, p50.Round(time.Millisecond), p99.Round(time.Millisecond), o.target, ratio)
	}
	w.Flush()
	b.ReportMetric(float64(pct(samples["open (baseline no-network)"], 0.5).Milliseconds()), "open-p50-ms")
	b.ReportMetric(float64(pct(samples["switch rules only (no-network -> allowlist)"], 0.5).Microseconds())/1000, "switch-rules-p50-ms")
	b.ReportMetric(float64(pct(samples["switch + rewiring (denylist -> public)"], 0.5).Milliseconds()), "switch-rewire-p50-ms")
	b.ReportMetric(float64(pct(samples["close"], 0.5).Milliseconds()), "close-p50-ms")
}
