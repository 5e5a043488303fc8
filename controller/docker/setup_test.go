package docker

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy"
)

// Two concurrent opens of one task: one wins, the other says the environment exists,
// and the loser removes nothing of the winner's.
func TestConcurrentOpensOfOneTask(t *testing.T) {
	r := newRig(t, "t10")
	spec := controller.EnvSpec{Task: "t10", Image: "agent:1", Baseline: policy.NoNetwork, ProxyStartTimeout: 5 * time.Second}
	envs := make([]*Env, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range envs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			envs[i], errs[i] = r.p.OpenEnv(context.Background(), spec)
		}()
	}
	wg.Wait()
	won := 0
	if errs[0] != nil {
		won = 1
	}
	lost := 1 - won
	if errs[won] != nil || errs[lost] == nil || !strings.Contains(errs[lost].Error(), "already exists") {
		t.Fatalf("opens: %v, %v; want one success and one saying the environment exists", errs[0], errs[1])
	}
	for _, name := range []string{"compass-proxy-t10", "compass-agent-t10"} {
		if _, err := r.docker.ContainerInspect(context.Background(), name); err != nil {
			t.Errorf("winner's %s: %v", name, err)
		}
	}
	if st, err := envs[won].Status(context.Background()); err != nil || !st.OK {
		t.Errorf("winner's status: %v %v", err, st.Problems)
	}
}

// A failed open leaves alone what it did not create: a container of the agent's name
// it could not create, and an attached container it never moved.
func TestFailedOpenRemovesOnlyWhatItMade(t *testing.T) {
	ctx := context.Background()
	t.Run("foreign agent name", func(t *testing.T) {
		r := newRig(t, "t11")
		if _, err := r.docker.ContainerCreate(ctx, &container.Config{Image: "agent:1"}, &container.HostConfig{NetworkMode: "bridge"}, nil, nil, "compass-agent-t11"); err != nil {
			t.Fatal(err)
		}
		_, err := r.p.OpenEnv(ctx, controller.EnvSpec{Task: "t11", Image: "agent:1", Baseline: policy.NoNetwork, ProxyStartTimeout: 5 * time.Second})
		if err == nil || !strings.Contains(err.Error(), "create agent") {
			t.Fatalf("open error = %v, want the agent's creation to fail", err)
		}
		if _, err := r.docker.ContainerInspect(ctx, "compass-agent-t11"); err != nil {
			t.Errorf("the container open did not create was removed: %v", err)
		}
		if _, err := r.docker.ContainerInspect(ctx, "compass-proxy-t11"); err == nil {
			t.Errorf("the sidecar open created was left")
		}
		if _, err := r.docker.NetworkInspect(ctx, "compass-net-t11", network.InspectOptions{}); err == nil {
			t.Errorf("the task network open created was left")
		}
	})
	t.Run("attach before the move", func(t *testing.T) {
		r := newRig(t, "t12")
		runUserContainer(t, r)
		_ = r.admin.srv.Close() // the sidecar never becomes ready
		_, err := r.p.Attach(ctx, controller.EnvSpec{Task: "t12", Baseline: policy.NoNetwork, ProxyStartTimeout: 300 * time.Millisecond}, "user")
		if err == nil || !strings.Contains(err.Error(), "not ready") {
			t.Fatalf("attach error = %v, want the sidecar not ready", err)
		}
		ci, err := r.docker.ContainerInspect(ctx, "user")
		if err != nil {
			t.Fatal(err)
		}
		if got := otherNetworks(ci); !reflect.DeepEqual(got, []string{"bridge"}) {
			t.Errorf("attached container's networks %v, want it left on bridge", got)
		}
		if len(r.docker.containers) != 1 {
			t.Errorf("containers left: %v", r.docker.containers)
		}
	})
}

// attach refuses a container another environment controls: that environment's next
// switch would rewire it behind this one's back (a switch to public there reconnects it
// to the egress network while this environment's record says no-network), and its close
// would take it off this environment's network.
func TestAttachRefusesAContainerOfAnotherEnvironment(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		victim string
		setUp  func(t *testing.T, r *rig)
	}{
		{"another environment's agent", "compass-agent-t1", func(t *testing.T, r *rig) { r.open(t, "t1", policy.NoNetwork) }},
		{"another environment's sidecar", "compass-proxy-t1", func(t *testing.T, r *rig) { r.open(t, "t1", policy.NoNetwork) }},
		{"a container attached to another environment", "user", func(t *testing.T, r *rig) {
			if _, err := r.p.Attach(ctx, controller.EnvSpec{Task: "t1", Baseline: policy.NoNetwork, ProxyStartTimeout: 5 * time.Second}, "user"); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, "t1")
			runUserContainer(t, r)
			tc.setUp(t, r)
			startFakeAdmin(t, stateDir(filepath.Join(r.p.cfg.StateDir, "t2")).socket(), r.ev)
			ci, err := r.docker.ContainerInspect(ctx, tc.victim)
			if err != nil {
				t.Fatal(err)
			}
			before := otherNetworks(ci)

			_, err = r.p.Attach(ctx, controller.EnvSpec{Task: "t2", Baseline: policy.NoNetwork, ProxyStartTimeout: 5 * time.Second}, tc.victim)
			if err == nil || !strings.Contains(err.Error(), "t1") {
				t.Errorf("attach to t2: %v, want a refusal naming environment t1", err)
			}
			if ci, err = r.docker.ContainerInspect(ctx, tc.victim); err != nil {
				t.Fatal(err)
			}
			if got := otherNetworks(ci); !reflect.DeepEqual(got, before) {
				t.Errorf("%s moved from %v to %v", tc.victim, before, got)
			}
			if _, err := r.docker.NetworkInspect(ctx, "compass-net-t2", network.InspectOptions{}); err == nil {
				t.Errorf("a refused attach created compass-net-t2")
			}
		})
	}
}

// An open without a valid baseline is refused before anything is created: it used to
// build networks, sidecar and agent, start them, and only then fail and tear them down.
func TestOpenWithoutBaselineChangesNothing(t *testing.T) {
	r := newRig(t, "t18")
	_, err := r.p.OpenEnv(context.Background(), controller.EnvSpec{Task: "t18", Image: "agent:1", ProxyStartTimeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "baseline") {
		t.Errorf("open without a baseline: %v, want an error naming the baseline", err)
	}
	if got := r.ev.all(); len(got) != 0 {
		t.Errorf("a refused open changed things: %v", got)
	}
}

// An open (or attach) refused because the proxy image is missing creates nothing: it
// used to create the shared egress network first and leave it behind.
func TestOpenWithoutProxyImageChangesNothing(t *testing.T) {
	for _, attach := range []bool{false, true} {
		t.Run(fmt.Sprintf("attach=%t", attach), func(t *testing.T) {
			r := newRig(t, "t19")
			if attach {
				runUserContainer(t, r)
			}
			delete(r.docker.images, DefaultProxyImage)
			before := len(r.ev.all())
			err := openOrAttach(r, "t19", policy.NoNetwork, attach)
			if err == nil || !strings.Contains(err.Error(), "proxy image "+DefaultProxyImage+" is missing") {
				t.Errorf("open without the proxy image: %v, want an error naming the image", err)
			}
			if got := r.ev.all()[before:]; len(got) != 0 {
				t.Errorf("a refused open changed things: %v", got)
			}
		})
	}
}

// openOrAttach opens task's environment under baseline with a new agent from
// "agent:1", or, with attach, attaches it to runUserContainer's "user".
func openOrAttach(r *rig, task string, baseline policy.Policy, attach bool) error {
	spec := controller.EnvSpec{Task: task, Image: "agent:1", Baseline: baseline, ProxyStartTimeout: 5 * time.Second}
	if attach {
		spec.Image = ""
		_, err := r.p.Attach(context.Background(), spec, "user")
		return err
	}
	_, err := r.p.OpenEnv(context.Background(), spec)
	return err
}

// runUserContainer starts, on the fake engine, a container "user" on a network
// "bridge": one that someone else created, for attach.
func runUserContainer(t *testing.T, r *rig) {
	t.Helper()
	ctx := context.Background()
	if _, err := r.docker.NetworkCreate(ctx, "bridge", network.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.docker.ContainerCreate(ctx, &container.Config{Image: "agent:1"}, &container.HostConfig{NetworkMode: "bridge"}, nil, nil, "user"); err != nil {
		t.Fatal(err)
	}
	if err := r.docker.ContainerStart(ctx, "user", container.StartOptions{}); err != nil {
		t.Fatal(err)
	}
}
