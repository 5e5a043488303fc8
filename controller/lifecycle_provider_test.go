package controller_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/controllertest"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// specProvider is the fake provider that keeps every EnvSpec it was asked to open.
type specProvider struct {
	*controllertest.Provider
	mu    *sync.Mutex
	specs *[]controller.EnvSpec
}

func (p specProvider) Open(ctx context.Context, spec controller.EnvSpec) (controller.Environment, error) {
	p.mu.Lock()
	*p.specs = append(*p.specs, spec)
	p.mu.Unlock()
	return p.Provider.Open(ctx, spec)
}

// TestOpenSpec: each environment is opened with the task's image, environment variables,
// proxy start timeout and the baseline of its role, in both modes.
func TestOpenSpec(t *testing.T) {
	for _, tc := range []struct {
		mode policy.EvaluationMode
		want []string // role image baseline
	}{
		{policy.EvaluationShared, []string{"agent agent:1 public"}},
		{policy.EvaluationFresh, []string{"agent agent:1 public", "evaluation grader:1 no-network"}},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			var specs []controller.EnvSpec
			p := specProvider{controllertest.New(), &sync.Mutex{}, &specs}
			tr := task(t, tc.mode)
			tr.Env = map[string]string{"HOME": "/work"}
			tr.ProxyStartTimeout = 7 * time.Second
			if _, err := newRunner(t, p).RunTask(context.Background(), tr, nil); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range specs {
				got = append(got, string(s.Role)+" "+s.Image+" "+string(s.Baseline.Mode))
				if s.Task != tr.ID || !maps.Equal(s.Env, tr.Env) || s.ProxyStartTimeout != tr.ProxyStartTimeout {
					t.Errorf("spec %+v: want task %s, env %v, proxy start timeout %s", s, tr.ID, tr.Env, tr.ProxyStartTimeout)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("opened %v, want %v", got, tc.want)
			}
		})
	}
}

// wrappingProvider is the fake provider whose environments come wrapped: a wrapper
// that embeds controller.Environment offers only its methods and its own, not the fake's
// optional ones (Uploader, ...).
type wrappingProvider struct {
	*controllertest.Provider
	wrap func(controller.Environment) controller.Environment
}

func (p wrappingProvider) Open(ctx context.Context, spec controller.EnvSpec) (controller.Environment, error) {
	e, err := p.Provider.Open(ctx, spec)
	if err != nil {
		return nil, err
	}
	return p.wrap(e), nil
}

// bareEnv's switches report nothing but their error, as a provider's may when it fails
// before it knows anything.
type bareEnv struct{ controller.Environment }

func (e bareEnv) Apply(ctx context.Context, p policy.Policy, label controller.PhaseLabel) (controller.Transition, error) {
	_, err := e.Environment.Apply(ctx, p, label)
	return controller.Transition{}, err
}

// TestTransitionCompleted: what a provider leaves out of a switch's transition the
// runner fills in: task, environment, phase, the mode it switched from (the one in force
// before), the mode it switched to, the policy digest, time, duration, and for a failed
// switch its error.
func TestTransitionCompleted(t *testing.T) {
	for _, tc := range []struct {
		name     string
		applyErr error // of the switch to run
		want     []string
	}{
		{"every switch ok", nil,
			[]string{"baseline:>public ok", "run:public>allowlist ok", "evaluation:allowlist>denylist ok", "baseline:denylist>public ok"}},
		{"switch to run fails", errors.New("sidecar did not acknowledge"),
			[]string{"baseline:>public ok", "run:public>allowlist sidecar did not acknowledge"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := wrappingProvider{controllertest.New(), func(e controller.Environment) controller.Environment { return bareEnv{e} }}
			p.ApplyErr = func(phase string) error {
				if phase == string(policy.PhaseRun) {
					return tc.applyErr
				}
				return nil
			}
			tr := task(t, policy.EvaluationShared)
			rec, err := newRunner(t, p).RunTask(context.Background(), tr, nil)
			if (err == nil) != (tc.applyErr == nil) {
				t.Fatalf("RunTask: %v", err)
			}
			var got []string
			for _, tn := range rec.Transitions {
				outcome := "ok"
				if !tn.OK {
					outcome = tn.Error
				}
				got = append(got, tn.Phase+":"+string(tn.FromMode)+">"+string(tn.ToMode)+" "+outcome)
				if tn.Task != "t1" || tn.Environment != "t1" || tn.Digest != rec.Policies[tn.Phase].Digest() ||
					tn.Time.IsZero() || tn.Duration <= 0 {
					t.Errorf("transition %+v not completed", tn)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("transitions\n got  %v\n want %v", got, tc.want)
			}
		})
	}
}

// reachEnv says how to reach it.
type reachEnv struct{ controller.Environment }

func reachProvider() wrappingProvider {
	return wrappingProvider{controllertest.New(), func(e controller.Environment) controller.Environment { return reachEnv{e} }}
}

func (e reachEnv) Reach() string { return "docker exec -it " + e.ID() + " sh" }

// TestRetainReach: a retained environment's record says how to reach it in the
// provider's own words when the provider has them.
func TestRetainReach(t *testing.T) {
	tr := task(t, policy.EvaluationShared)
	tr.Retain = true
	rec, err := newRunner(t, reachProvider()).RunTask(context.Background(), tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	if e := rec.Environments[0]; e.State != controller.EnvRetained || e.Reach != "docker exec -it t1 sh" {
		t.Errorf("environment %+v, want retained with the provider's reach", e)
	}
}

// TestUploadUnsupported: with a provider that cannot copy files into an environment, the
// upload is skipped, saying why, rather than crashing the task.
func TestUploadUnsupported(t *testing.T) {
	rec, err := newRunner(t, reachProvider()).RunTask(context.Background(), task(t, policy.EvaluationFresh), nil)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(rec.Steps, func(s controller.StepRecord) bool { return s.Name == lifecycle.StepUpload })
	if s := rec.Steps[i]; s.Status != controller.StepSkipped || s.Reason != "the provider cannot copy files into an environment" {
		t.Errorf("upload recorded %s (%s), want skipped, saying why", s.Status, s.Reason)
	}
}
