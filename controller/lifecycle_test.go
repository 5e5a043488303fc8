package controller_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/controllertest"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func mustPolicy(t *testing.T, s string) policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(s))
	if err != nil {
		t.Fatalf("parse %s: %v", s, err)
	}
	return p
}

const notice = "<IMPORTANT>restricted</IMPORTANT>\n"

// task is a full task: every step declared, distinct policies per phase so that the
// event log shows which one each step ran under.
func task(t *testing.T, mode policy.EvaluationMode) controller.TaskRun {
	return controller.TaskRun{
		ID: "t1", Mode: mode, Image: "agent:1", EvaluationImage: "grader:1",
		Policies: controller.PhasePolicies{
			Baseline:           policy.Public,
			Run:                mustPolicy(t, `{"network_mode":"allowlist","allowed_hosts":["model.test:443"]}`),
			Evaluation:         mustPolicy(t, `{"network_mode":"denylist","denied_hosts":["exfil.test"]}`),
			EvaluationBaseline: policy.NoNetwork,
		},
		Notice: notice, InjectNotice: true,
		Prepare:       []lifecycle.Command{{"prep"}},
		Harness:       &lifecycle.HarnessSession{Start: []lifecycle.Command{{"hstart"}}, Close: []lifecycle.Command{{"hclose"}}},
		Run:           []lifecycle.Command{{"agent"}},
		Collect:       []lifecycle.Command{{"collect"}},
		Artifacts:     []string{"/out/result.tar"},
		SaveArtifacts: true,
		Evaluate:      []lifecycle.Command{{"grade"}},
	}
}

func newRunner(t *testing.T, p controller.Provider) *controller.Runner {
	return &controller.Runner{Provider: p, OutDir: t.TempDir()}
}

func readRecord(t *testing.T, r *controller.Runner, task string) *controller.Record {
	t.Helper()
	rec, err := controller.ReadRecord(filepath.Join(r.OutDir, task))
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func checkEvents(t *testing.T, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("events:\n got  %s\n want %s", strings.Join(got, "\n      "), strings.Join(want, "\n      "))
	}
}

func TestLifecycleOrder(t *testing.T) {
	noticeQ := ` notice="<IMPORTANT>restricted</IMPORTANT>\n"`
	tests := []struct {
		name string
		mode policy.EvaluationMode
		want []string
	}{
		{"shared", policy.EvaluationShared, []string{
			"agent open public image=agent:1",
			"agent exec [prep] mode=public",
			"agent exec [hstart] mode=public",
			"agent apply run allowlist",
			"agent exec [agent] mode=allowlist" + noticeQ,
			"agent exec [hclose] mode=allowlist",
			"agent exec [collect] mode=allowlist",
			"agent download /out/result.tar mode=allowlist",
			"agent apply evaluation denylist",
			"agent exec [grade] mode=denylist",
			"agent apply baseline public",
			"agent close retain=false mode=public",
		}},
		{"fresh", policy.EvaluationFresh, []string{
			"agent open public image=agent:1",
			"agent exec [prep] mode=public",
			"agent exec [hstart] mode=public",
			"agent apply run allowlist",
			"agent exec [agent] mode=allowlist" + noticeQ,
			"agent exec [hclose] mode=allowlist",
			"agent exec [collect] mode=allowlist",
			"agent download /out/result.tar mode=allowlist",
			"agent close retain=false mode=allowlist",
			"evaluation open no-network image=grader:1",
			"evaluation upload /out/result.tar mode=no-network",
			"evaluation apply evaluation denylist",
			"evaluation exec [grade] mode=denylist",
			"evaluation apply evaluation_baseline no-network",
			"evaluation close retain=false mode=no-network",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := controllertest.New()
			r := newRunner(t, p)
			rec, err := r.RunTask(context.Background(), task(t, tc.mode), nil)
			if err != nil {
				t.Fatalf("RunTask: %v", err)
			}
			checkEvents(t, p.Events(), tc.want)
			if rec.Status != controller.StatusSucceeded {
				t.Errorf("status %s (%s)", rec.Status, rec.Error)
			}
			if live := p.Live(); len(live) != 0 {
				t.Errorf("environments left open: %v", live)
			}
			// The record is as readable as the step logs beside it.
			if fi, err := os.Stat(filepath.Join(r.OutDir, rec.Task, controller.RecordFile)); err != nil || fi.Mode().Perm() != 0o644 {
				t.Errorf("record file: %v, %v; want mode 0644", fi, err)
			}
		})
	}
}

// stepsOf lists "name:status" for each recorded step.
func stepsOf(rec *controller.Record) []string {
	var out []string
	for _, s := range rec.Steps {
		out = append(out, string(s.Name)+":"+string(s.Status))
	}
	return out
}

func TestStepConditions(t *testing.T) {
	tests := []struct {
		name    string
		mode    policy.EvaluationMode // shared unless set
		change  func(tr *controller.TaskRun, p *controllertest.Provider, taskDir string)
		steps   []string
		status  controller.TaskStatus
		reasons map[lifecycle.StepName]string
		errs    map[lifecycle.StepName]string // what a step's error says
		where   map[lifecycle.StepName]string // a skipped step's "environment phase mode"
		taskErr string                        // what the record's error says
	}{
		{
			name:   "no harness session: steps 3 and 5 skipped",
			change: func(tr *controller.TaskRun, _ *controllertest.Provider, _ string) { tr.Harness = nil },
			steps: []string{"open:ok", "prepare:ok", "harness_start:skipped", "run:ok", "harness_close:skipped",
				"collect:ok", "download:ok", "evaluate:ok", "close:ok"},
			status: controller.StatusSucceeded,
			reasons: map[lifecycle.StepName]string{lifecycle.StepHarnessStart: "no harness session declared",
				lifecycle.StepHarnessClose: "no harness session was started"},
			where: map[lifecycle.StepName]string{lifecycle.StepHarnessStart: "t1 baseline public",
				lifecycle.StepHarnessClose: "t1 run allowlist"},
		},
		{
			name: "no collection commands, no save_artifacts",
			change: func(tr *controller.TaskRun, _ *controllertest.Provider, _ string) {
				tr.Collect, tr.SaveArtifacts = nil, false
			},
			steps: []string{"open:ok", "prepare:ok", "harness_start:ok", "run:ok", "harness_close:ok",
				"collect:skipped", "download:skipped", "evaluate:ok", "close:ok"},
			status: controller.StatusSucceeded,
			reasons: map[lifecycle.StepName]string{lifecycle.StepCollect: "no collection commands declared",
				lifecycle.StepDownload: "save_artifacts is false"},
		},
		{
			name:   "save_artifacts without paths",
			change: func(tr *controller.TaskRun, _ *controllertest.Provider, _ string) { tr.Artifacts = nil },
			steps: []string{"open:ok", "prepare:ok", "harness_start:ok", "run:ok", "harness_close:ok",
				"collect:ok", "download:skipped", "evaluate:ok", "close:ok"},
			status:  controller.StatusSucceeded,
			reasons: map[lifecycle.StepName]string{lifecycle.StepDownload: "no artifact paths declared"},
		},
		{
			name: "artifact path that does not resolve",
			change: func(_ *controller.TaskRun, p *controllertest.Provider, _ string) {
				p.Missing = map[string]bool{"/out/result.tar": true}
			},
			steps: []string{"open:ok", "prepare:ok", "harness_start:ok", "run:ok", "harness_close:ok",
				"collect:ok", "download:failed", "evaluate:ok", "close:ok"},
			status: controller.StatusFailed,
		},
		{
			name: "failed prepare ends the task under the baseline",
			change: func(tr *controller.TaskRun, _ *controllertest.Provider, _ string) {
				tr.Prepare = []lifecycle.Command{{"exit", "3"}}
			},
			steps:  []string{"open:ok", "prepare:failed", "close:ok"},
			status: controller.StatusFailed,
			errs:   map[lifecycle.StepName]string{lifecycle.StepPrepare: "step prepare: exit 3 exited 3"},
		},
		{
			name: "a step log that cannot be written ends the task",
			change: func(_ *controller.TaskRun, _ *controllertest.Provider, taskDir string) {
				if err := os.MkdirAll(taskDir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(taskDir, "logs"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			},
			steps:  []string{"open:ok", "prepare:error", "close:ok"},
			status: controller.StatusFailed,
			errs:   map[lifecycle.StepName]string{lifecycle.StepPrepare: "create log directory"},
		},
		{
			name: "a negative exit status is a failure",
			change: func(tr *controller.TaskRun, _ *controllertest.Provider, _ string) {
				tr.Prepare = []lifecycle.Command{{"exit", "-1"}}
			},
			steps:  []string{"open:ok", "prepare:failed", "close:ok"},
			status: controller.StatusFailed,
		},
		{
			name: "failed harness start ends the task",
			change: func(tr *controller.TaskRun, _ *controllertest.Provider, _ string) {
				tr.Harness.Start = []lifecycle.Command{{"exit", "1"}}
			},
			steps:  []string{"open:ok", "prepare:ok", "harness_start:failed", "close:ok"},
			status: controller.StatusFailed,
		},
		{
			name: "failed rollout still collects and evaluates",
			change: func(tr *controller.TaskRun, _ *controllertest.Provider, _ string) {
				tr.Run = []lifecycle.Command{{"exit", "2"}, {"never-run"}}
			},
			steps: []string{"open:ok", "prepare:ok", "harness_start:ok", "run:failed", "harness_close:ok",
				"collect:ok", "download:ok", "evaluate:ok", "close:ok"},
			status:  controller.StatusFailed,
			taskErr: "steps not ok: [run failed]",
		},
		{
			name: "failed harness close still collects and evaluates",
			change: func(tr *controller.TaskRun, _ *controllertest.Provider, _ string) {
				tr.Harness.Close = []lifecycle.Command{{"exit", "4"}}
			},
			steps: []string{"open:ok", "prepare:ok", "harness_start:ok", "run:ok", "harness_close:failed",
				"collect:ok", "download:ok", "evaluate:ok", "close:ok"},
			status: controller.StatusFailed,
		},
		{
			name: "failed collection still downloads and evaluates",
			change: func(tr *controller.TaskRun, _ *controllertest.Provider, _ string) {
				tr.Collect = []lifecycle.Command{{"exit", "5"}}
			},
			steps: []string{"open:ok", "prepare:ok", "harness_start:ok", "run:ok", "harness_close:ok",
				"collect:failed", "download:ok", "evaluate:ok", "close:ok"},
			status: controller.StatusFailed,
		},
		{
			name: "fresh: an artifact that was not saved is not uploaded",
			mode: policy.EvaluationFresh,
			change: func(_ *controller.TaskRun, p *controllertest.Provider, _ string) {
				p.Missing = map[string]bool{"/out/result.tar": true}
			},
			steps: []string{"open:ok", "prepare:ok", "harness_start:ok", "run:ok", "harness_close:ok",
				"collect:ok", "download:failed", "close:ok", "evaluation_open:ok", "upload_artifacts:skipped",
				"evaluate:ok", "evaluation_close:ok"},
			status:  controller.StatusFailed,
			reasons: map[lifecycle.StepName]string{lifecycle.StepUpload: "no saved artifacts"},
			taskErr: "steps not ok: [download failed]",
		},
		{
			// The grader would judge without the agent's work: nothing is evaluated.
			name: "fresh: a failed upload of the artifacts ends the task before evaluate",
			mode: policy.EvaluationFresh,
			change: func(_ *controller.TaskRun, p *controllertest.Provider, taskDir string) {
				p.OpenErr = func(role lifecycle.Role) error {
					if role == lifecycle.RoleEvaluation {
						// The saved artifact is gone by the time it is to be uploaded.
						return os.RemoveAll(filepath.Join(taskDir, "artifacts"))
					}
					return nil
				}
			},
			steps: []string{"open:ok", "prepare:ok", "harness_start:ok", "run:ok", "harness_close:ok",
				"collect:ok", "download:ok", "close:ok", "evaluation_open:ok", "upload_artifacts:error", "evaluation_close:ok"},
			status: controller.StatusFailed,
		},
		{
			name: "rollout timeout is recorded and evaluation still runs",
			change: func(tr *controller.TaskRun, _ *controllertest.Provider, _ string) {
				tr.Run = []lifecycle.Command{{"hang"}}
				tr.Timeouts = map[lifecycle.StepName]time.Duration{lifecycle.StepRun: 20 * time.Millisecond}
			},
			steps: []string{"open:ok", "prepare:ok", "harness_start:ok", "run:timed_out", "harness_close:ok",
				"collect:ok", "download:ok", "evaluate:ok", "close:ok"},
			status: controller.StatusFailed,
			errs:   map[lifecycle.StepName]string{lifecycle.StepRun: "step run: hang: context deadline exceeded"},
		},
		{
			// A crash is not the rollout's own failure: nothing more runs in the task.
			name: "a panic in the rollout ends the task",
			change: func(tr *controller.TaskRun, _ *controllertest.Provider, _ string) {
				tr.Run = []lifecycle.Command{{"panic"}}
			},
			steps:  []string{"open:ok", "prepare:ok", "harness_start:ok", "run:crashed", "close:ok"},
			status: controller.StatusFailed,
			errs:   map[lifecycle.StepName]string{lifecycle.StepRun: "step run panicked: fake: command panicked"},
		},
		{
			name: "a timed-out rollout that could not be stopped ends the task before anything runs under another policy",
			change: func(tr *controller.TaskRun, _ *controllertest.Provider, _ string) {
				tr.Run = []lifecycle.Command{{"unkillable"}}
				tr.Timeouts = map[lifecycle.StepName]time.Duration{lifecycle.StepRun: 20 * time.Millisecond}
			},
			steps:  []string{"open:ok", "prepare:ok", "harness_start:ok", "run:error", "close:ok"},
			status: controller.StatusFailed,
		},
		{
			name: "prepare timeout ends the task",
			change: func(tr *controller.TaskRun, _ *controllertest.Provider, _ string) {
				tr.Prepare = []lifecycle.Command{{"hang"}}
				tr.Timeouts = map[lifecycle.StepName]time.Duration{lifecycle.StepPrepare: 20 * time.Millisecond}
			},
			steps:  []string{"open:ok", "prepare:timed_out", "close:ok"},
			status: controller.StatusFailed,
		},
		{
			name: "failed switch to run: nothing runs, environment closed",
			change: func(_ *controller.TaskRun, p *controllertest.Provider, _ string) {
				p.ApplyErr = func(phase string) error {
					if phase == string(policy.PhaseRun) {
						return errors.New("sidecar did not acknowledge")
					}
					return nil
				}
			},
			steps:  []string{"open:ok", "prepare:ok", "harness_start:ok", "close:ok"},
			status: controller.StatusFailed,
		},
		{
			name: "open fails",
			change: func(_ *controller.TaskRun, p *controllertest.Provider, _ string) {
				p.OpenErr = func(lifecycle.Role) error { return errors.New("image missing") }
			},
			steps:  []string{"open:error"},
			status: controller.StatusFailed,
			errs:   map[lifecycle.StepName]string{lifecycle.StepOpen: "open agent environment: image missing"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := controllertest.New()
			mode := tc.mode
			if mode == "" {
				mode = policy.EvaluationShared
			}
			tr := task(t, mode)
			r := newRunner(t, p)
			tc.change(&tr, p, filepath.Join(r.OutDir, tr.ID))
			rec, err := r.RunTask(context.Background(), tr, nil)
			if (err == nil) != (tc.status == controller.StatusSucceeded) {
				t.Errorf("err = %v with status %s", err, rec.Status)
			}
			if got := stepsOf(rec); !slices.Equal(got, tc.steps) {
				t.Errorf("steps\n got  %v\n want %v", got, tc.steps)
			}
			if rec.Status != tc.status {
				t.Errorf("status %s, want %s (%s)", rec.Status, tc.status, rec.Error)
			}
			if (rec.Error == "") != (tc.status == controller.StatusSucceeded) || !strings.Contains(rec.Error, tc.taskErr) {
				t.Errorf("task error %q, want it to say %q", rec.Error, tc.taskErr)
			}
			for _, s := range rec.Steps {
				if want, ok := tc.reasons[s.Name]; ok && s.Reason != want {
					t.Errorf("step %s reason %q, want %q", s.Name, s.Reason, want)
				}
				if want, ok := tc.errs[s.Name]; ok && !strings.Contains(s.Error, want) {
					t.Errorf("step %s error %q, want it to say %q", s.Name, s.Error, want)
				}
				if want, ok := tc.where[s.Name]; ok && s.Environment+" "+s.Phase+" "+string(s.Mode) != want {
					t.Errorf("step %s in %q %q %q, want %q", s.Name, s.Environment, s.Phase, s.Mode, want)
				}
				if s.TimedOut != (s.Status == controller.StepTimedOut) {
					t.Errorf("step %s %s has timed_out %t", s.Name, s.Status, s.TimedOut)
				}
				if s.Status == controller.StepFailed && s.Name != lifecycle.StepDownload && (s.ExitCode == nil || *s.ExitCode == 0) {
					t.Errorf("failed step %s records exit code %v", s.Name, s.ExitCode)
				}
			}
			if live := p.Live(); len(live) != 0 {
				t.Errorf("environments left open: %v", live)
			}
			if onDisk := readRecord(t, r, tr.ID); !slices.Equal(stepsOf(onDisk), tc.steps) {
				t.Errorf("record on disk differs from the returned one: %v", stepsOf(onDisk))
			}
		})
	}
}

// TestEvaluateRestoresBaseline ends the evaluate step every way it can end and checks
// that the environment's baseline was put back before it closed, in both modes.
func TestEvaluateRestoresBaseline(t *testing.T) {
	endings := []struct {
		name     string
		evaluate []lifecycle.Command
		timeout  time.Duration
		step     controller.StepStatus
		status   controller.TaskStatus
	}{
		{"non-zero exit", []lifecycle.Command{{"exit", "1"}}, 0, controller.StepFailed, controller.StatusFailed},
		{"timeout", []lifecycle.Command{{"hang"}}, 20 * time.Millisecond, controller.StepTimedOut, controller.StatusFailed},
		{"cancellation", []lifecycle.Command{{"cancel"}, {"hang"}}, 0, controller.StepCancelled, controller.StatusCancelled},
		{"panic", []lifecycle.Command{{"panic"}}, 0, controller.StepCrashed, controller.StatusFailed},
	}
	modes := []struct {
		mode    policy.EvaluationMode
		role    string
		restore string
	}{
		{policy.EvaluationShared, "agent", "agent apply baseline public"},
		{policy.EvaluationFresh, "evaluation", "evaluation apply evaluation_baseline no-network"},
	}
	for _, m := range modes {
		for _, e := range endings {
			t.Run(string(m.mode)+"/"+e.name, func(t *testing.T) {
				p := controllertest.New()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				p.Cancel = cancel
				tr := task(t, m.mode)
				tr.Evaluate = e.evaluate
				if e.timeout > 0 {
					tr.Timeouts = map[lifecycle.StepName]time.Duration{lifecycle.StepEvaluate: e.timeout}
				}
				r := newRunner(t, p)
				rec, err := r.RunTask(ctx, tr, nil)
				if err == nil {
					t.Fatal("RunTask succeeded")
				}
				ev := p.Events()
				applyEval := slices.Index(ev, m.role+" apply evaluation denylist")
				restore := slices.Index(ev, m.restore)
				closeAt := slices.IndexFunc(ev, func(s string) bool { return strings.HasPrefix(s, m.role+" close") })
				if applyEval < 0 || restore < applyEval || closeAt < restore {
					t.Errorf("want evaluation switch, then restore, then close; events:\n%s", strings.Join(ev, "\n"))
				}
				if want := m.role + " close retain=false mode=" + map[string]string{"agent": "public", "evaluation": "no-network"}[m.role]; ev[len(ev)-1] != want {
					t.Errorf("last event %q, want %q", ev[len(ev)-1], want)
				}
				var got controller.StepStatus
				for _, s := range rec.Steps {
					if s.Name == lifecycle.StepEvaluate {
						got = s.Status
					}
				}
				if got != e.step || rec.Status != e.status {
					t.Errorf("evaluate step %s, task %s; want %s, %s", got, rec.Status, e.step, e.status)
				}
				last := rec.Transitions[len(rec.Transitions)-1]
				if !last.OK || last.Phase != map[string]string{"agent": "baseline", "evaluation": "evaluation_baseline"}[m.role] {
					t.Errorf("last transition %+v is not the restore", last)
				}
				if len(p.Live()) != 0 {
					t.Errorf("environments left open: %v", p.Live())
				}
			})
		}
	}
}

// TestEvaluateRestoreFails: a restore of the baseline after evaluate that fails is a
// failed switch, however the step ended: the task fails, its error names the switch, and
// the environment closes under no egress at all.
func TestEvaluateRestoreFails(t *testing.T) {
	for _, e := range []struct {
		name     string
		evaluate []lifecycle.Command
		step     string
	}{
		{"ok", []lifecycle.Command{{"grade"}}, "evaluate:ok"},
		{"non-zero exit", []lifecycle.Command{{"exit", "1"}}, "evaluate:failed"},
		{"panic", []lifecycle.Command{{"panic"}}, "evaluate:crashed"},
	} {
		t.Run(e.name, func(t *testing.T) {
			p := controllertest.New()
			p.ApplyErr = func(phase string) error {
				if phase == string(policy.PhaseBaseline) {
					return errors.New("sidecar did not acknowledge")
				}
				return nil
			}
			tr := task(t, policy.EvaluationShared)
			tr.Evaluate = e.evaluate
			r := newRunner(t, p)
			rec, err := r.RunTask(context.Background(), tr, nil)
			if err == nil || !strings.Contains(err.Error(), "switch t1 to baseline: sidecar did not acknowledge") {
				t.Errorf("RunTask: %v, want it to name the failed restore", err)
			}
			if rec.Status != controller.StatusFailed || !slices.Contains(stepsOf(rec), e.step) {
				t.Errorf("status %s, steps %v; want failed with %s", rec.Status, stepsOf(rec), e.step)
			}
			if ev := p.Events(); ev[len(ev)-1] != "agent close retain=false mode=no-network" {
				t.Errorf("last event %q, want the close under no-network", ev[len(ev)-1])
			}
		})
	}
}

// TestEvaluateNotStoppedLosesEgress: an evaluate command that timed out and could not be
// killed may still run, so the environment gets no-network instead of its baseline
// (public in shared mode) and closes under it.
func TestEvaluateNotStoppedLosesEgress(t *testing.T) {
	for _, m := range []struct {
		mode policy.EvaluationMode
		role string
	}{
		{policy.EvaluationShared, "agent"},
		{policy.EvaluationFresh, "evaluation"},
	} {
		t.Run(string(m.mode), func(t *testing.T) {
			p := controllertest.New()
			tr := task(t, m.mode)
			tr.Evaluate = []lifecycle.Command{{"unkillable"}}
			tr.Timeouts = map[lifecycle.StepName]time.Duration{lifecycle.StepEvaluate: 20 * time.Millisecond}
			rec, err := newRunner(t, p).RunTask(context.Background(), tr, nil)
			if err == nil {
				t.Fatal("RunTask succeeded")
			}
			ev := p.Events()
			evalAt := slices.Index(ev, m.role+" apply evaluation denylist")
			cutAt := slices.Index(ev, m.role+" apply "+controller.PhaseNotStopped+" no-network")
			if evalAt < 0 || cutAt < evalAt {
				t.Errorf("want the evaluation switch, then no-network; events:\n%s", strings.Join(ev, "\n"))
			}
			for _, e := range ev[evalAt+1:] {
				if strings.Contains(e, " apply ") && !strings.HasSuffix(e, " no-network") {
					t.Errorf("%q after the command could not be stopped", e)
				}
			}
			if want := m.role + " close retain=false mode=no-network"; ev[len(ev)-1] != want {
				t.Errorf("last event %q, want %q", ev[len(ev)-1], want)
			}
			if last := rec.Transitions[len(rec.Transitions)-1]; !last.OK || last.Phase != controller.PhaseNotStopped || last.ToMode != policy.ModeNoNetwork {
				t.Errorf("last transition %+v, want the switch to no-network", last)
			}
		})
	}
}

// TestCancellation cancels the run during each step: nothing runs after, every
// environment is closed under the policy in force (never a broader one) and the record
// says cancelled.
func TestCancellation(t *testing.T) {
	tests := []struct {
		mode      policy.EvaluationMode
		step      lifecycle.StepName
		closeLine string
	}{
		{policy.EvaluationShared, lifecycle.StepPrepare, "agent close retain=false mode=public"},
		{policy.EvaluationShared, lifecycle.StepHarnessStart, "agent close retain=false mode=public"},
		{policy.EvaluationShared, lifecycle.StepRun, "agent close retain=false mode=allowlist"},
		{policy.EvaluationShared, lifecycle.StepHarnessClose, "agent close retain=false mode=allowlist"},
		{policy.EvaluationShared, lifecycle.StepCollect, "agent close retain=false mode=allowlist"},
		{policy.EvaluationShared, lifecycle.StepEvaluate, "agent close retain=false mode=public"},
		{policy.EvaluationFresh, lifecycle.StepRun, "agent close retain=false mode=allowlist"},
		{policy.EvaluationFresh, lifecycle.StepEvaluate, "evaluation close retain=false mode=no-network"},
	}
	for _, tc := range tests {
		t.Run(string(tc.mode)+"/"+string(tc.step), func(t *testing.T) {
			p := controllertest.New()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			p.Cancel = cancel
			tr := task(t, tc.mode)
			stop := []lifecycle.Command{{"cancel"}, {"hang"}}
			switch tc.step {
			case lifecycle.StepPrepare:
				tr.Prepare = stop
			case lifecycle.StepHarnessStart:
				tr.Harness.Start = stop
			case lifecycle.StepRun:
				tr.Run = stop
			case lifecycle.StepHarnessClose:
				tr.Harness.Close = stop
			case lifecycle.StepCollect:
				tr.Collect = stop
			case lifecycle.StepEvaluate:
				tr.Evaluate = stop
			}
			r := newRunner(t, p)
			rec, err := r.RunTask(ctx, tr, nil)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("err = %v, want context.Canceled", err)
			}
			if rec.Status != controller.StatusCancelled {
				t.Errorf("status %s", rec.Status)
			}
			ev := p.Events()
			if ev[len(ev)-1] != tc.closeLine {
				t.Errorf("last event %q, want %q\n%s", ev[len(ev)-1], tc.closeLine, strings.Join(ev, "\n"))
			}
			hangAt := slices.IndexFunc(ev, func(s string) bool { return strings.Contains(s, "exec [hang]") })
			for _, e := range ev[hangAt+1:] {
				if strings.Contains(e, " exec ") || strings.Contains(e, " open ") {
					t.Errorf("%q after the cancellation", e)
				}
			}
			last := rec.Steps[len(rec.Steps)-2] // the cancelled step, then the close
			if last.Name != tc.step || last.Status != controller.StepCancelled {
				t.Errorf("cancelled step recorded as %s:%s", last.Name, last.Status)
			}
			// The summary of the phase in force at the close is read though the run is cancelled.
			if b := rec.Blocked[len(rec.Blocked)-1]; b.Error != "" {
				t.Errorf("last phase's blocked summary %+v, want it read", b)
			}
			if len(p.Live()) != 0 {
				t.Errorf("environments left open: %v", p.Live())
			}
		})
	}
}

// TestCancelledAfterTheEnd cancels the run while a task's last environment closes: every
// step has run, so the task keeps the outcome of its steps. Recorded as cancelled, it
// would not count as finished: --resume would refuse a shared task (and with it the
// whole run) or run a fresh task's evaluation again.
func TestCancelledAfterTheEnd(t *testing.T) {
	tests := []struct {
		name   string
		mode   policy.EvaluationMode
		run    []lifecycle.Command
		status controller.TaskStatus
	}{
		{"shared, all ok", policy.EvaluationShared, nil, controller.StatusSucceeded},
		{"fresh, all ok", policy.EvaluationFresh, nil, controller.StatusSucceeded},
		{"shared, rollout failed", policy.EvaluationShared, []lifecycle.Command{{"exit", "1"}}, controller.StatusFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := controllertest.New()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			last := map[policy.EvaluationMode]lifecycle.Role{
				policy.EvaluationShared: lifecycle.RoleAgent, policy.EvaluationFresh: lifecycle.RoleEvaluation}[tc.mode]
			p.CloseErr = func(role lifecycle.Role) error {
				if role == last {
					cancel() // Ctrl-C while the last close is under way
				}
				return nil
			}
			tr := task(t, tc.mode)
			if tc.run != nil {
				tr.Run = tc.run
			}
			r := newRunner(t, p)
			rec, err := r.RunTask(ctx, tr, nil)
			if rec.Status != tc.status || (err == nil) != (tc.status == controller.StatusSucceeded) {
				t.Errorf("status %s, err %v; want %s", rec.Status, err, tc.status)
			}
			if !controller.Finished(readRecord(t, r, tr.ID)) {
				t.Error("the record does not count as finished")
			}
		})
	}
}

// TestDownloadCutShort cancels the run as the download step starts (a copy may still
// succeed: the fake's does not look at its context). The paths not copied are recorded
// as not saved, the step did not end ok, and --resume must not take the agent's part as
// over and evaluate without them.
func TestDownloadCutShort(t *testing.T) {
	p := controllertest.New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p.Cancel = cancel
	tr := task(t, policy.EvaluationFresh)
	tr.Artifacts = []string{"/out/a.tar", "/out/b.tar"}
	tr.Collect = []lifecycle.Command{{"cancel"}} // Ctrl-C as collection ends
	r := newRunner(t, p)
	rec, _ := r.RunTask(ctx, tr, nil)
	for _, s := range rec.Steps {
		if s.Name == lifecycle.StepDownload && s.Status != controller.StepCancelled {
			t.Errorf("download step %s (%s), want %s", s.Status, s.Error, controller.StepCancelled)
		}
	}
	saved := map[string]bool{}
	for _, a := range rec.Artifacts {
		saved[a.Path] = a.Saved
	}
	if got, ok := saved["/out/b.tar"]; !ok || got {
		t.Errorf("artifact /out/b.tar recorded %v (present %v), want recorded as not saved: %+v", got, ok, rec.Artifacts)
	}
	if from, err := controller.ResumeFrom(rec, tr, p); err == nil {
		t.Errorf("resume accepted from %q with /out/b.tar never downloaded", from)
	}
}

// TestFailedSwitchLeavesNoEgress fails a switch, by the enforcement point's error or by
// a Ctrl-C while it is under way: nothing more runs, and the environment closes with no
// egress (Environment.Apply's contract, which the fake keeps too), as the record says.
func TestFailedSwitchLeavesNoEgress(t *testing.T) {
	tests := []struct {
		name   string
		phase  string
		cancel bool // cancel the run as the switch starts, instead of failing it
	}{
		{"switch to run fails", string(policy.PhaseRun), false},
		{"switch to run cancelled", string(policy.PhaseRun), true},
		{"switch to evaluation fails", string(policy.PhaseEvaluation), false},
		{"switch to evaluation cancelled", string(policy.PhaseEvaluation), true},
		{"switch to run panics", string(policy.PhaseRun), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := controllertest.New()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			panics := strings.HasSuffix(tc.name, "panics")
			p.ApplyErr = func(phase string) error {
				switch {
				case phase != tc.phase || panics:
					return nil
				case tc.cancel:
					cancel()
					return nil
				}
				return errors.New("sidecar did not acknowledge")
			}
			p.ApplyPanics = func(phase string) bool { return panics && phase == tc.phase }
			r := newRunner(t, p)
			rec, err := r.RunTask(ctx, task(t, policy.EvaluationShared), nil)
			if err == nil {
				t.Fatal("RunTask succeeded")
			}
			// The failed switch is in the record, with the phase it was to start.
			if last := rec.Transitions[len(rec.Transitions)-1]; last.OK || last.Phase != tc.phase {
				t.Errorf("last transition %+v, want the failed switch to %s", last, tc.phase)
			}
			ev := p.Events()
			if want := "agent close retain=false mode=no-network"; ev[len(ev)-1] != want {
				t.Errorf("last event %q, want %q\n%s", ev[len(ev)-1], want, strings.Join(ev, "\n"))
			}
			if last := rec.Steps[len(rec.Steps)-1]; last.Name != lifecycle.StepClose || last.Mode != policy.ModeNoNetwork {
				t.Errorf("last step %s under %s, want close under no-network", last.Name, last.Mode)
			}
		})
	}
}

// TestClosePanics makes the provider's close panic, in both modes. The close also runs
// in RunTask's deferred clean-up, where a panic would escape the task and end the whole
// run's process, leaving every other task's environments behind; it must end this task
// as failed instead, its environment recorded as still open.
func TestClosePanics(t *testing.T) {
	for _, mode := range []policy.EvaluationMode{policy.EvaluationShared, policy.EvaluationFresh} {
		t.Run(string(mode), func(t *testing.T) {
			p := controllertest.New()
			p.CloseErr = func(lifecycle.Role) error { panic("fake: close panicked") }
			r := newRunner(t, p)
			var rec *controller.Record
			var err error
			func() {
				defer func() {
					if v := recover(); v != nil {
						t.Fatalf("panic escaped RunTask: %v", v)
					}
				}()
				rec, err = r.RunTask(context.Background(), task(t, mode), nil)
			}()
			if err == nil || rec.Status != controller.StatusFailed {
				t.Errorf("status %s, err %v; want failed", rec.Status, err)
			}
			if rec.Environments[0].State != controller.EnvOpen {
				t.Errorf("agent environment recorded %s, want open (its close never completed)", rec.Environments[0].State)
			}
		})
	}
}

func TestRetain(t *testing.T) {
	p := controllertest.New()
	tr := task(t, policy.EvaluationFresh)
	tr.Retain = true
	r := newRunner(t, p)
	rec, err := r.RunTask(context.Background(), tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	if live := p.Live(); len(live) != 2 {
		t.Errorf("retained environments %v, want both", live)
	}
	for _, e := range rec.Environments {
		if e.State != controller.EnvRetained || !strings.Contains(e.Reach, "compassctl env close --task t1") {
			t.Errorf("environment %+v", e)
		}
	}
}

func TestRecordContents(t *testing.T) {
	p := controllertest.New()
	tr := task(t, policy.EvaluationFresh)
	tr.Plan = json.RawMessage(`{"applied_recipes":["model-endpoint"]}`)
	tr.Run = []lifecycle.Command{{"blocked", "3"}}
	tr.Evaluate = []lifecycle.Command{{"blocked", "1"}}
	r := newRunner(t, p)
	if _, err := r.RunTask(context.Background(), tr, nil); err != nil {
		t.Fatal(err)
	}
	rec := readRecord(t, r, "t1")
	if rec.Version != controller.RecordVersion || rec.Task != "t1" || rec.TaskDigest != tr.Digest() || rec.Ended == nil {
		t.Errorf("header %+v", rec)
	}
	var plan bytes.Buffer
	if err := json.Compact(&plan, rec.Plan); err != nil || plan.String() != `{"applied_recipes":["model-endpoint"]}` {
		t.Errorf("plan %s", rec.Plan)
	}
	wantModes := map[string]policy.Mode{"baseline_network_mode": "public", "run_network_mode": "allowlist",
		"evaluation_network_mode": "denylist", "evaluation_baseline_network_mode": "no-network"}
	for k, v := range wantModes {
		if rec.NetworkModes[k] != v {
			t.Errorf("%s = %s, want %s", k, rec.NetworkModes[k], v)
		}
	}
	if !rec.Policies[string(policy.PhaseRun)].Equal(tr.Policies.Run) {
		t.Errorf("run policy %s", rec.Policies[string(policy.PhaseRun)])
	}
	b, err := os.ReadFile(filepath.Join(r.OutDir, "t1", controller.NoticeFile))
	if err != nil || string(b) != notice || !rec.Notice.Injected {
		t.Errorf("notice %q %v %+v", b, err, rec.Notice)
	}
	var trans []string
	for _, tn := range rec.Transitions {
		if !tn.OK || tn.Digest == "" || tn.Task != "t1" || tn.Duration <= 0 {
			t.Errorf("transition %+v", tn)
		}
		trans = append(trans, tn.Environment+":"+tn.Phase+":"+string(tn.FromMode)+">"+string(tn.ToMode))
	}
	wantTrans := []string{"t1:baseline:>public", "t1:run:public>allowlist", "t1-eval:evaluation_baseline:>no-network",
		"t1-eval:evaluation:no-network>denylist", "t1-eval:evaluation_baseline:denylist>no-network"}
	if !slices.Equal(trans, wantTrans) {
		t.Errorf("transitions\n got  %v\n want %v", trans, wantTrans)
	}
	var blocked []string
	for _, b := range rec.Blocked {
		blocked = append(blocked, b.Environment+":"+b.Phase+":"+string(rune('0'+b.Summary.Total)))
	}
	wantBlocked := []string{"t1:baseline:0", "t1:run:3", "t1-eval:evaluation_baseline:0", "t1-eval:evaluation:1", "t1-eval:evaluation_baseline:0"}
	if !slices.Equal(blocked, wantBlocked) {
		t.Errorf("blocked\n got  %v\n want %v", blocked, wantBlocked)
	}
	if rec.Blocked[1].Summary.Top[0].Host != "exfil.test" {
		t.Errorf("top blocked %+v", rec.Blocked[1].Summary.Top)
	}
	if len(rec.Artifacts) != 1 || !rec.Artifacts[0].Saved || rec.Artifacts[0].Local != "artifacts/out/result.tar" {
		t.Fatalf("artifacts %+v", rec.Artifacts)
	}
	if _, err := os.Stat(filepath.Join(r.OutDir, "t1", rec.Artifacts[0].Local)); err != nil {
		t.Errorf("saved artifact: %v", err)
	}
	for _, s := range rec.Steps {
		if s.Status == controller.StepSkipped {
			continue
		}
		if s.End == nil || s.End.Before(s.Start) || s.Mode == "" {
			t.Errorf("step %+v", s)
		}
	}
	run := rec.Steps[slices.IndexFunc(rec.Steps, func(s controller.StepRecord) bool { return s.Name == lifecycle.StepRun })]
	if run.Log != "logs/run.log" || *run.ExitCode != 0 || len(run.Commands) != 1 || run.Phase != "run" {
		t.Errorf("run step %+v", run)
	}
	logb, err := os.ReadFile(filepath.Join(r.OutDir, "t1", run.Log))
	if err != nil || !strings.Contains(string(logb), "### blocked 3 (exit 0)\n{\"cmd\":\"blocked\"}\n") {
		t.Errorf("run log %q %v", logb, err)
	}
}

func TestNotice(t *testing.T) {
	tests := []struct {
		name   string
		change func(*controller.TaskRun)
		reason string
	}{
		{"turned off", func(tr *controller.TaskRun) { tr.InjectNotice = false }, "inject_network_restriction_notice is false"},
		{"public run policy", func(tr *controller.TaskRun) { tr.Notice, tr.Policies.Run = "", policy.Public }, "the run policy is public: no statement"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := controllertest.New()
			tr := task(t, policy.EvaluationShared)
			tc.change(&tr)
			r := newRunner(t, p)
			rec, err := r.RunTask(context.Background(), tr, nil)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Notice.Injected || rec.Notice.Reason != tc.reason {
				t.Errorf("notice record %+v", rec.Notice)
			}
			if _, err := os.Stat(filepath.Join(r.OutDir, "t1", controller.NoticeFile)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("notice file: %v", err)
			}
			for _, e := range p.Events() {
				if strings.Contains(e, "notice=") {
					t.Errorf("notice passed to a step: %s", e)
				}
			}
		})
	}
}

func TestRunAll(t *testing.T) {
	p := controllertest.New()
	var tasks []controller.TaskRun
	for _, id := range []string{"a", "b", "c", "d"} {
		tr := task(t, policy.EvaluationFresh)
		tr.ID = id
		tasks = append(tasks, tr)
	}
	r := newRunner(t, p)
	// A concurrency below 1 runs one task at a time. The deadline only bounds the test
	// should it wait forever for a slot: the tasks are then recorded cancelled.
	for _, concurrency := range []int{2, 0} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out := r.RunAll(ctx, tasks, concurrency, nil)
		cancel()
		for i, o := range out {
			if o.Err != nil || o.Task != tasks[i].ID || o.Record.Status != controller.StatusSucceeded {
				t.Errorf("concurrency %d, task %s: %v %+v", concurrency, o.Task, o.Err, o.Record)
			}
			if rec := readRecord(t, r, o.Task); rec.Task != o.Task || len(rec.Environments) != 2 {
				t.Errorf("record of %s: %+v", o.Task, rec)
			}
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out := r.RunAll(ctx, tasks[:1], 1, nil)
	if out[0].Record == nil || out[0].Record.Status != controller.StatusCancelled || len(p.Live()) != 0 {
		t.Errorf("cancelled run: %+v", out[0])
	}
}

func TestCloseRetry(t *testing.T) {
	tests := []struct {
		name     string
		failures int
		status   controller.TaskStatus
		state    controller.EnvState
	}{
		{"transient failure", 1, controller.StatusSucceeded, controller.EnvClosed},
		{"lasting failure", 100, controller.StatusFailed, controller.EnvOpen},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := controllertest.New()
			var mu sync.Mutex
			left := tc.failures
			p.CloseErr = func(lifecycle.Role) error {
				mu.Lock()
				defer mu.Unlock()
				if left > 0 {
					left--
					return errors.New("network has active endpoints")
				}
				return nil
			}
			r := newRunner(t, p)
			rec, _ := r.RunTask(context.Background(), task(t, policy.EvaluationShared), nil)
			if rec.Status != tc.status || rec.Environments[0].State != tc.state {
				t.Errorf("status %s, environment %s; want %s, %s", rec.Status, rec.Environments[0].State, tc.status, tc.state)
			}
		})
	}
}

// panicking is the fake provider with one operation that panics: a provider bug.
type panicking struct {
	*controllertest.Provider
	op string
}

func (p panicking) Open(ctx context.Context, spec controller.EnvSpec) (controller.Environment, error) {
	if p.op == "open" {
		panic("provider: open panicked")
	}
	e, err := p.Provider.Open(ctx, spec)
	if err != nil {
		return nil, err
	}
	return panickingEnv{Env: e.(*controllertest.Env), op: p.op}, nil
}

type panickingEnv struct {
	*controllertest.Env
	op string
}

func (e panickingEnv) Download(ctx context.Context, src, dst string) error {
	if e.op == "download" {
		panic("provider: download panicked")
	}
	return e.Env.Download(ctx, src, dst)
}

func (e panickingEnv) Upload(ctx context.Context, src, dst string) error {
	if e.op == "upload" {
		panic("provider: upload panicked")
	}
	return e.Env.Upload(ctx, src, dst)
}

// TestProviderPanicEndsStep makes a provider operation that is not a command panic
// during its step. The runner survives and ends the task failed; the step it was in
// must not stay "running" in the final record, which would read as a step still under
// way in a task that has ended.
func TestProviderPanicEndsStep(t *testing.T) {
	for _, tc := range []struct {
		op   string
		mode policy.EvaluationMode
		step lifecycle.StepName
	}{
		{"open", policy.EvaluationShared, lifecycle.StepOpen},
		{"download", policy.EvaluationShared, lifecycle.StepDownload},
		{"upload", policy.EvaluationFresh, lifecycle.StepUpload},
	} {
		t.Run(tc.op, func(t *testing.T) {
			fake := controllertest.New()
			r := newRunner(t, panicking{Provider: fake, op: tc.op})
			tr := task(t, tc.mode)
			// A step that ended before the panic keeps its own outcome.
			tr.Run = []lifecycle.Command{{"exit", "2"}}
			rec, err := r.RunTask(context.Background(), tr, nil)
			if err == nil || rec.Status != controller.StatusFailed {
				t.Fatalf("status %s, err %v; want failed", rec.Status, err)
			}
			onDisk := readRecord(t, r, "t1")
			for _, s := range onDisk.Steps {
				if s.Status == controller.StepRunning || s.End == nil {
					t.Errorf("step %s left %s (end %v) in the final record", s.Name, s.Status, s.End)
				}
				if (s.Name == tc.step) != (s.Status == controller.StepCrashed) {
					t.Errorf("step %s recorded %s; want only %s crashed", s.Name, s.Status, tc.step)
				}
			}
			if live := fake.Live(); len(live) != 0 {
				t.Errorf("environments left open: %v", live)
			}
		})
	}
}

// TestRecordWriteFailure: a task whose record could not be written does not count as a
// success, though every step of it was ok: the record on disk does not say how it ended.
func TestRecordWriteFailure(t *testing.T) {
	p := controllertest.New()
	tr := task(t, policy.EvaluationShared)
	tr.Evaluate = []lifecycle.Command{{"cancel"}}
	r := newRunner(t, p)
	dir := filepath.Join(r.OutDir, tr.ID)
	// During evaluate, the task directory goes away and a file takes its name.
	p.Cancel = func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Error(err)
		}
		if err := os.WriteFile(dir, nil, 0o644); err != nil {
			t.Error(err)
		}
	}
	rec, err := r.RunTask(context.Background(), tr, nil)
	if err == nil || !strings.Contains(err.Error(), "write record") {
		t.Errorf("RunTask: %v, want the record's write failure", err)
	}
	if got := stepsOf(rec); !slices.Equal(got, []string{"open:ok", "prepare:ok", "harness_start:ok", "run:ok",
		"harness_close:ok", "collect:ok", "download:ok", "evaluate:ok", "close:ok"}) {
		t.Errorf("steps %v", got)
	}
}
