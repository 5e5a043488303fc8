package dockerenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/policy"
)

// scaleEnvsFromEnv is how many environments TestConcurrentEnvironments opens: 50 in
// `make test`; COMPASS_E2E_SCALE_ENVS=200 measures the scale target (make scale-env).
func scaleEnvsFromEnv(t *testing.T) int {
	v := os.Getenv("COMPASS_E2E_SCALE_ENVS")
	if v == "" {
		return 50
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("COMPASS_E2E_SCALE_ENVS=%q: want a positive integer", v)
	}
	return n
}

// Many environments opened, switched and closed concurrently; nothing is left behind.
// Not parallel with the other tests: it runs first, alone, so that its load on the
// engine does not starve them; make test runs it in a pass of its own, after every other
// package, for the same reason.
func TestConcurrentEnvironments(t *testing.T) {
	h.Need(t)
	scaleEnvs := scaleEnvsFromEnv(t)
	ctx := timeout(t, time.Duration(scaleEnvs)*10*time.Second)
	p := h.Provider(t)
	envs := make([]*docker.Env, scaleEnvs)
	tasks := make([]string, scaleEnvs)
	errs := make([]error, scaleEnvs)
	parallel := func(what string, f func(i int) error) {
		start := time.Now()
		defer func() {
			t.Logf("%d environments: %s in %s", scaleEnvs, what, time.Since(start).Round(time.Millisecond))
		}()
		var wg sync.WaitGroup
		for i := range envs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = f(i)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("env %d: %v", i, err)
			}
		}
	}
	parallel("open", func(i int) error {
		tasks[i] = h.Name("scale")
		e, err := p.OpenEnv(ctx, controller.EnvSpec{Task: tasks[i], Image: h.ProbeImage, Baseline: policy.NoNetwork, ProxyStartTimeout: 3 * time.Minute})
		envs[i] = e
		return err
	})
	t.Cleanup(func() {
		for i, task := range tasks {
			if envs[i] != nil || task != "" {
				_ = p.RemoveByName(context.Background(), task)
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	parallel("switch", func(i int) error {
		tr, err := envs[i].Apply(ctx, allowlist, controller.PhaseLabel{Phase: "run"})
		if err == nil && (!tr.OK || tr.ToMode != policy.ModeAllowlist) {
			err = fmt.Errorf("transition %+v", tr)
		}
		return err
	})
	parallel("status", func(i int) error {
		st, err := envs[i].Status(ctx)
		if err == nil && (!st.OK || st.Sidecar.Digest != allowlist.Digest()) {
			err = fmt.Errorf("status after switch: %v", st.Problems)
		}
		return err
	})
	parallel("close", func(i int) error { return envs[i].Close(ctx, false) })

	left, err := h.Leftovers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range left {
		if strings.Contains(l, "-scale-") {
			t.Errorf("left behind: %s", l)
		}
	}
	for _, task := range tasks {
		if _, err := os.Stat(filepath.Join(h.StateDir, task)); !os.IsNotExist(err) {
			t.Errorf("state directory of %s left behind (%v)", task, err)
		}
	}
}
