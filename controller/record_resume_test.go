package controller_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/controllertest"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// interrupted runs tr until the "cancel" command, as a Ctrl-C would stop it.
func interrupted(t *testing.T, p controller.Provider, fake *controllertest.Provider, r *controller.Runner, tr controller.TaskRun) *controller.Record {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fake.Cancel = cancel
	rec, err := r.RunTask(ctx, tr, nil)
	if err == nil || rec.Status != controller.StatusCancelled {
		t.Fatalf("interrupted run: %v, %s", err, rec.Status)
	}
	return rec
}

func TestResumeFreshEvaluation(t *testing.T) {
	fake := controllertest.New()
	r := newRunner(t, fake)
	tr := task(t, policy.EvaluationFresh)
	if rec, err := r.RunTask(ctrlCAtEvaluationOpen(t, fake), tr, nil); err == nil || rec.Status != controller.StatusCancelled {
		t.Fatalf("interrupted run: %v", err)
	}
	fake.OpenErr = nil
	before := len(fake.Events())

	rec, err := r.RunTask(context.Background(), tr, readRecord(t, r, "t1"))
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	if rec.Status != controller.StatusSucceeded || len(rec.Resumes) != 1 || rec.Resumes[0].From != lifecycle.StepEvaluationOpen {
		t.Errorf("status %s (%s), resumes %+v", rec.Status, rec.Error, rec.Resumes)
	}
	want := []string{
		"evaluation open no-network image=grader:1",
		"evaluation upload /out/result.tar mode=no-network",
		"evaluation apply evaluation denylist",
		"evaluation exec [grade] mode=denylist",
		"evaluation apply evaluation_baseline no-network",
		"evaluation close retain=false mode=no-network",
	}
	checkEvents(t, fake.Events()[before:], want)
	if got := stepsOf(rec); !slices.Contains(got, "run:ok") || !slices.Contains(got, "evaluation_open:cancelled") {
		t.Errorf("earlier steps not kept in the record: %v", got)
	}
}

// diedDuringEvaluation runs task t1 (fresh evaluation) to its end on fake, then makes
// its record look like a runner that died during evaluation, with the evaluation
// environment still open.
func diedDuringEvaluation(t *testing.T, fake *controllertest.Provider) (*controller.Runner, controller.TaskRun, *controller.Record) {
	t.Helper()
	tr := task(t, policy.EvaluationFresh)
	r := newRunner(t, fake)
	if _, err := r.RunTask(context.Background(), tr, nil); err != nil {
		t.Fatal(err)
	}
	rec := readRecord(t, r, "t1")
	rec.Status, rec.Ended = controller.StatusRunning, nil
	rec.Steps = rec.Steps[:len(rec.Steps)-2]
	for i := range rec.Environments {
		if rec.Environments[i].Role == lifecycle.RoleEvaluation {
			rec.Environments[i].State = controller.EnvOpen
		}
	}
	return r, tr, rec
}

func TestResumeClosesLeftovers(t *testing.T) {
	fake := controllertest.New()
	r, tr, rec := diedDuringEvaluation(t, fake)
	if _, err := fake.Open(context.Background(), controller.EnvSpec{Task: "t1", Role: lifecycle.RoleEvaluation}); err != nil {
		t.Fatal(err)
	}

	if _, err := controller.ResumeFrom(rec, tr, fake); err == nil || !strings.Contains(err.Error(), "cannot reattach") {
		t.Errorf("resume without reattach: %v", err)
	}
	r.Provider = controllertest.ReattachingProvider{Provider: fake}
	out, err := r.RunTask(context.Background(), tr, rec)
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	if out.Status != controller.StatusSucceeded || len(fake.Live()) != 0 {
		t.Errorf("status %s, live %v", out.Status, fake.Live())
	}
	if !slices.Contains(fake.Events(), "evaluation reattach") {
		t.Errorf("leftover not reattached: %v", fake.Events())
	}
	// Its close is recorded in the phase it was found in; the mode then in force is not
	// known, so none is claimed.
	i := slices.IndexFunc(out.Steps, func(s controller.StepRecord) bool { return s.Name == lifecycle.StepEvaluationEnd })
	if s := out.Steps[i]; s.Phase != "reattached" || s.Mode != "" || s.Status != controller.StepOK {
		t.Errorf("leftover's close recorded %s, phase %q, mode %q; want ok, reattached, no mode", s.Status, s.Phase, s.Mode)
	}
}

func TestResumeRefusals(t *testing.T) {
	fake := controllertest.New()
	r := newRunner(t, fake)

	shared := task(t, policy.EvaluationShared)
	shared.ID = "s"
	shared.Run = []lifecycle.Command{{"cancel"}, {"hang"}}
	sharedRec := interrupted(t, fake, fake, r, shared)

	fresh := task(t, policy.EvaluationFresh)
	fresh.ID = "f"
	fresh.Run = []lifecycle.Command{{"cancel"}, {"hang"}}
	freshRec := interrupted(t, fake, fake, r, fresh)

	// Nothing to download: the collection is the last of the agent's part.
	collecting := task(t, policy.EvaluationFresh)
	collecting.ID = "c"
	collecting.Collect, collecting.SaveArtifacts = []lifecycle.Command{{"cancel"}, {"hang"}}, false
	collectingRec := interrupted(t, fake, fake, r, collecting)

	// Nothing after the harness close in the agent's part.
	closing := task(t, policy.EvaluationFresh)
	closing.ID = "h"
	closing.Harness.Close = []lifecycle.Command{{"cancel"}, {"hang"}}
	closing.Collect, closing.SaveArtifacts = nil, false
	closingRec := interrupted(t, fake, fake, r, closing)

	done := task(t, policy.EvaluationShared)
	done.ID = "d"
	doneRec, err := r.RunTask(context.Background(), done, nil)
	if err != nil {
		t.Fatal(err)
	}
	changed := shared
	changed.Evaluate = []lifecycle.Command{{"other"}}

	tests := []struct {
		name string
		rec  *controller.Record
		task controller.TaskRun
		want string
	}{
		{"shared mode after the agent started", sharedRec, shared, "shared mode"},
		{"fresh mode before the agent's part ended", freshRec, fresh, "run not ended"},
		{"fresh mode, collection cut", collectingRec, collecting, "collect not ended"},
		{"fresh mode, harness close cut", closingRec, closing, "harness_close not ended"},
		{"finished task", doneRec, done, "already finished (succeeded)"},
		{"changed definition", sharedRec, changed, "definition changed"},
		{"another task's record", doneRec, shared, `the record is of task "d"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := controller.ResumeFrom(tc.rec, tc.task, fake)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to say %q", err, tc.want)
			}
			before := len(fake.Events())
			rec, err := r.RunTask(context.Background(), tc.task, tc.rec)
			if err == nil {
				t.Error("RunTask resumed a refused task")
			}
			// The outcome is the interrupted run's record, untouched: the summary shows
			// that run's status, and nothing of the task was touched.
			if rec != tc.rec || len(fake.Events()) != before {
				t.Errorf("RunTask on a refused resume: record %p (want the interrupted run's %p), events %v",
					rec, tc.rec, fake.Events()[before:])
			}
		})
	}

	// A task that never opened an environment starts from the top.
	never := task(t, policy.EvaluationShared)
	never.ID = "n"
	fake.OpenErr = func(lifecycle.Role) error { return context.Canceled }
	neverRec, _ := r.RunTask(context.Background(), never, nil)
	fake.OpenErr = nil
	if from, err := controller.ResumeFrom(neverRec, never, fake); err != nil || from != lifecycle.StepOpen {
		t.Errorf("never-opened task: %s, %v", from, err)
	}
}

// A leftover the provider reports gone is recorded closed and the resume goes on; one it
// could not reach (the engine unreachable) stays open in the record and stops the resume:
// marking it closed would leave it running, with whatever policy it had, where no later
// resume or record points at it.
func TestResumeLeftoverGoneOrUnreached(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       error
		running   bool // the leftover still exists
		wantState controller.EnvState
		wantErr   string
	}{
		{"gone", fmt.Errorf("no such thing: %w", controller.ErrEnvironmentGone), false, controller.EnvClosed, ""},
		{"unreached", errors.New("engine unreachable"), true, controller.EnvOpen, "engine unreachable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := controllertest.New()
			r, tr, rec := diedDuringEvaluation(t, fake)
			if tc.running {
				if _, err := fake.Open(context.Background(), controller.EnvSpec{Task: "t1", Role: lifecycle.RoleEvaluation, Baseline: policy.Public}); err != nil {
					t.Fatal(err)
				}
			}
			fake.ReattachErr = func(lifecycle.Role) error { return tc.err }
			r.Provider = controllertest.ReattachingProvider{Provider: fake}
			before := len(fake.Events())

			out, err := r.RunTask(context.Background(), tr, rec)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("resume: %v, want error %q", err, tc.wantErr)
			}
			// The first evaluation environment is the leftover; a resume that went on
			// opened a second one.
			for _, e := range out.Environments {
				if e.Role == lifecycle.RoleEvaluation {
					if e.State != tc.wantState {
						t.Errorf("leftover recorded as %s (%s), want %s", e.State, e.Reach, tc.wantState)
					}
					break
				}
			}
			if got := fake.Events()[before:]; tc.running && len(got) != 0 {
				t.Errorf("resume went on past an unreached leftover: %v", got)
			}
		})
	}
}

// TestResumeChecksDefinition resumes a task that never opened an environment (the only
// shared-mode task --resume takes) after its definition changed. The shared task is built
// as the planner builds it, with no evaluation baseline: its digest must still identify
// it, or the resume would run the new definition under a record of the old one.
func TestResumeChecksDefinition(t *testing.T) {
	fake := controllertest.New()
	r := newRunner(t, fake)
	asPlanned := func(mode policy.EvaluationMode) controller.TaskRun {
		tr := task(t, mode)
		if mode == policy.EvaluationShared {
			tr.Policies.EvaluationBaseline = policy.Policy{}
		}
		return tr
	}
	neverOpened := func(tr controller.TaskRun) *controller.Record {
		fake.OpenErr = func(lifecycle.Role) error { return context.Canceled }
		defer func() { fake.OpenErr = nil }()
		rec, _ := r.RunTask(context.Background(), tr, nil)
		return rec
	}
	withRun := func(tr controller.TaskRun, run string) controller.TaskRun {
		tr.Run = []lifecycle.Command{{run}}
		return tr
	}
	shared, fresh := asPlanned(policy.EvaluationShared), asPlanned(policy.EvaluationFresh)
	// A definition whose digest cannot be computed, and a record without one: two empty
	// digests are no evidence of the same definition.
	undigested := shared
	undigested.Policies.Evaluation = policy.Policy{}
	noDigest := neverOpened(shared)
	noDigest.TaskDigest = ""
	tests := []struct {
		name string
		rec  *controller.Record
		task controller.TaskRun
		want string // "": resumes from the top
	}{
		{"shared, unchanged", neverOpened(shared), shared, ""},
		{"shared, run changed", neverOpened(shared), withRun(shared, "other"), "definition changed"},
		{"fresh, run changed", neverOpened(fresh), withRun(fresh, "other"), "definition changed"},
		{"no digest on either side", noDigest, undigested, "has no task_digest"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			from, err := controller.ResumeFrom(tc.rec, tc.task, fake)
			switch {
			case tc.want == "" && (err != nil || from != lifecycle.StepOpen):
				t.Errorf("ResumeFrom = %q, %v; want %q", from, err, lifecycle.StepOpen)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("ResumeFrom = %q, %v; want an error saying %q", from, err, tc.want)
			}
		})
	}
}

// TestRunAllCancelledBeforeResume cancels a --resume run before its tasks start: a task
// that was to resume keeps the record of its interrupted run (the only evidence of what
// ran there and of what a later --resume must pick up), and nothing starts. Several
// tasks, all free to start, so that a select that may still start one is caught.
func TestRunAllCancelledBeforeResume(t *testing.T) {
	fake := controllertest.New()
	r := newRunner(t, fake)
	var tasks []controller.TaskRun
	prevs := map[string]*controller.Record{}
	for _, id := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		tr := task(t, policy.EvaluationFresh)
		tr.ID = id
		tr.Evaluate = []lifecycle.Command{{"cancel"}, {"hang"}}
		interrupted(t, fake, fake, r, tr)
		prevs[id] = readRecord(t, r, id)
		tasks = append(tasks, tr)
	}
	before := len(fake.Events())

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out := r.RunAll(ctx, tasks, len(tasks), prevs)
	if got := fake.Events()[before:]; len(got) != 0 {
		t.Errorf("a task started after the cancellation: %v", got)
	}
	for i, tr := range tasks {
		prev := prevs[tr.ID]
		if !errors.Is(out[i].Err, context.Canceled) {
			t.Errorf("task %s: outcome error %v, want context.Canceled", tr.ID, out[i].Err)
		}
		onDisk := readRecord(t, r, tr.ID)
		if !slices.Equal(stepsOf(onDisk), stepsOf(prev)) || len(onDisk.Environments) != len(prev.Environments) || len(onDisk.Resumes) != 0 {
			t.Errorf("task %s: record of the interrupted run replaced:\n got  %v, %d environments, resumes %v\n want %v, %d environments",
				tr.ID, stepsOf(onDisk), len(onDisk.Environments), onDisk.Resumes, stepsOf(prev), len(prev.Environments))
		}
		// A wiped record would resume from the top, running the agent's part again.
		if from, err := controller.ResumeFrom(onDisk, tr, fake); err != nil || from != lifecycle.StepEvaluationOpen {
			t.Errorf("task %s: a later --resume would start at %q (%v), want %q", tr.ID, from, err, lifecycle.StepEvaluationOpen)
		}
	}
}

// TestResumeRetainedTask resumes a retained fresh task whose evaluation was interrupted,
// by the runner's death (the evaluation environment still open in the record) or by a
// Ctrl-C (kept, as retain asks). The resume opens a new evaluation environment of the
// same name, so the interrupted one must be removed first, not kept again: kept, the new
// one cannot open and the task ends failed, for good. The agent environment stays
// retained.
func TestResumeRetainedTask(t *testing.T) {
	for _, tc := range []struct {
		name      string
		interrupt func(t *testing.T, fake *controllertest.Provider, r *controller.Runner, tr controller.TaskRun) *controller.Record
	}{
		{"runner died", func(t *testing.T, fake *controllertest.Provider, r *controller.Runner, tr controller.TaskRun) *controller.Record {
			if _, err := r.RunTask(context.Background(), tr, nil); err != nil {
				t.Fatal(err)
			}
			rec := readRecord(t, r, tr.ID)
			rec.Status, rec.Ended = controller.StatusRunning, nil
			rec.Steps = rec.Steps[:len(rec.Steps)-2]
			for i := range rec.Environments {
				if rec.Environments[i].Role == lifecycle.RoleEvaluation {
					rec.Environments[i].State, rec.Environments[i].Reach = controller.EnvOpen, ""
				}
			}
			return rec
		}},
		{"Ctrl-C", func(t *testing.T, fake *controllertest.Provider, r *controller.Runner, tr controller.TaskRun) *controller.Record {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			fake.ApplyErr = func(phase string) error {
				if phase == string(policy.PhaseEvaluation) {
					cancel() // Ctrl-C as the evaluation policy is being put in force
				}
				return nil
			}
			defer func() { fake.ApplyErr = nil }()
			if rec, err := r.RunTask(ctx, tr, nil); err == nil || rec.Status != controller.StatusCancelled {
				t.Fatalf("interrupted run: %v, %s", err, rec.Status)
			}
			return readRecord(t, r, tr.ID)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := controllertest.New()
			r := newRunner(t, fake)
			tr := task(t, policy.EvaluationFresh)
			tr.Retain = true
			prev := tc.interrupt(t, fake, r, tr)
			r.Provider = controllertest.ReattachingProvider{Provider: fake}
			if _, err := controller.ResumeFrom(prev, tr, r.Provider); err != nil {
				t.Fatalf("ResumeFrom: %v", err)
			}
			before := len(fake.Events())

			out, err := r.RunTask(context.Background(), tr, prev)
			if err != nil || out.Status != controller.StatusSucceeded {
				t.Fatalf("resume: %v, status %s\n%s", err, out.Status, strings.Join(fake.Events()[before:], "\n"))
			}
			ev := fake.Events()[before:]
			if i, j := slices.Index(ev, "evaluation close retain=false mode=no-network"), slices.Index(ev, "evaluation open no-network image=grader:1"); i < 0 || j < i {
				t.Errorf("the interrupted evaluation environment was not removed before the new one opened:\n%s", strings.Join(ev, "\n"))
			}
			states := map[controller.EnvState]int{}
			for _, e := range out.Environments {
				if e.Role == lifecycle.RoleEvaluation {
					states[e.State]++
				}
			}
			if states[controller.EnvClosed] != 1 || states[controller.EnvRetained] != 1 {
				t.Errorf("evaluation environments recorded %v, want the interrupted one closed and the new one retained", out.Environments)
			}
			if live := fake.Live(); !slices.Equal(slices.Sorted(slices.Values(live)), []string{"t1", "t1-eval"}) {
				t.Errorf("live environments %v, want the retained agent and the new evaluation environment", live)
			}
		})
	}
}

// TestResumeUnreachedLeftoverCanResumeAgain: a resume stopped by a leftover it could
// not look up or close (the engine unreachable) ran nothing; the record must still be
// one a later --resume picks up, once the engine is back, not a finished task left alone.
func TestResumeUnreachedLeftoverCanResumeAgain(t *testing.T) {
	unreachable := errors.New("engine unreachable")
	for _, tc := range []struct {
		name string
		fail func(fake *controllertest.Provider)
	}{
		{"lookup fails", func(fake *controllertest.Provider) {
			fake.ReattachErr = func(lifecycle.Role) error { return unreachable }
		}},
		{"close fails", func(fake *controllertest.Provider) {
			fake.CloseErr = func(lifecycle.Role) error { return unreachable }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := controllertest.New()
			r, tr, rec := diedDuringEvaluation(t, fake)
			if _, err := fake.Open(context.Background(), controller.EnvSpec{Task: "t1", Role: lifecycle.RoleEvaluation, Baseline: policy.Public}); err != nil {
				t.Fatal(err)
			}
			r.Provider = controllertest.ReattachingProvider{Provider: fake}
			tc.fail(fake)
			if _, err := r.RunTask(context.Background(), tr, rec); !errors.Is(err, unreachable) {
				t.Fatalf("resume: %v, want it stopped by the unreachable leftover", err)
			}
			fake.ReattachErr, fake.CloseErr = nil, nil

			again := readRecord(t, r, tr.ID)
			if controller.Finished(again) {
				t.Fatalf("record %s with ended set: a later --resume would leave the task alone", again.Status)
			}
			// The interrupted run's status and end stand: its runner died, so it never ended.
			if again.Status != rec.Status || again.Ended != nil {
				t.Errorf("record %s, ended %v; want the interrupted run's %s, no end", again.Status, again.Ended, rec.Status)
			}
			if _, err := controller.ResumeFrom(again, tr, r.Provider); err != nil {
				t.Fatalf("later resume refused: %v", err)
			}
			out, err := r.RunTask(context.Background(), tr, again)
			if err != nil || out.Status != controller.StatusSucceeded || len(fake.Live()) != 0 {
				t.Errorf("later resume: %v, status %s, live %v", err, out.Status, fake.Live())
			}
		})
	}
}

// TestResumePanicKeepsInterruptedSteps: a resumed run that panics ends its own step
// crashed, and leaves the step the interrupted run shows running as that run left it.
func TestResumePanicKeepsInterruptedSteps(t *testing.T) {
	fake := controllertest.New()
	r, tr, rec := diedDuringEvaluation(t, fake)
	for i := range rec.Environments {
		rec.Environments[i].State = controller.EnvClosed // nothing left to reattach
	}
	rec.Steps = append(rec.Steps, controller.StepRecord{Name: lifecycle.StepEvaluate, Status: controller.StepRunning})
	dead := len(rec.Steps) - 1
	r.Provider = panicking{Provider: fake, op: "upload"}

	out, err := r.RunTask(context.Background(), tr, rec)
	if err == nil {
		t.Fatal("resume succeeded with a panicking upload")
	}
	if s := out.Steps[dead]; s.Status != controller.StepRunning || s.Error != "" {
		t.Errorf("the interrupted run's step recorded %s (%s), want it left running", s.Status, s.Error)
	}
	if got := stepsOf(out)[dead+1:]; !slices.Contains(got, "upload_artifacts:crashed") {
		t.Errorf("this run's steps %v, want the upload crashed", got)
	}
}

// TestResumeLeavesPreviousRecord: RunTask works on its own copy of the interrupted run's
// record; the caller's copy still shows what that run left (a later look at it, or a
// retry with it, must not see this run's changes).
func TestResumeLeavesPreviousRecord(t *testing.T) {
	fake := controllertest.New()
	r, tr, rec := diedDuringEvaluation(t, fake)
	if _, err := fake.Open(context.Background(), controller.EnvSpec{Task: "t1", Role: lifecycle.RoleEvaluation}); err != nil {
		t.Fatal(err)
	}
	r.Provider = controllertest.ReattachingProvider{Provider: fake}
	want := fmt.Sprint(rec.Environments, stepsOf(rec))
	if _, err := r.RunTask(context.Background(), tr, rec); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if got := fmt.Sprint(rec.Environments, stepsOf(rec)); got != want {
		t.Errorf("the interrupted run's record changed under the caller:\n got  %s\n want %s", got, want)
	}
}

// TestResumeAfterACutOpen: a runner that died inside a provider's Open left the
// environment's objects under the name the resume's open needs, with no environment in
// the record. The resume closes what it finds (the open never ended, so nothing is kept)
// before it opens again; a provider that cannot reattach is refused, naming the way out.
func TestResumeAfterACutOpen(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode policy.EvaluationMode
		role lifecycle.Role
		open lifecycle.StepName
	}{
		{"agent open, shared", policy.EvaluationShared, lifecycle.RoleAgent, lifecycle.StepOpen},
		{"agent open, fresh", policy.EvaluationFresh, lifecycle.RoleAgent, lifecycle.StepOpen},
		{"evaluation open", policy.EvaluationFresh, lifecycle.RoleEvaluation, lifecycle.StepEvaluationOpen},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := controllertest.New()
			r := newRunner(t, fake)
			tr := task(t, tc.mode)
			tr.Retain = true // a cut open's leftover is removed all the same
			if _, err := r.RunTask(context.Background(), tr, nil); err != nil {
				t.Fatal(err)
			}
			// The record as the runner left it when it died inside the open, and an engine
			// that holds only what that open had created.
			fake = controllertest.New()
			prev := readRecord(t, r, tr.ID)
			prev.Status, prev.Ended = controller.StatusRunning, nil
			cut := slices.IndexFunc(prev.Steps, func(s controller.StepRecord) bool { return s.Name == tc.open })
			prev.Steps = prev.Steps[:cut+1]
			prev.Steps[cut].Status, prev.Steps[cut].End, prev.Steps[cut].Environment = controller.StepRunning, nil, ""
			// No environment opened from the cut one on (the agent's open is the first).
			prev.Environments = slices.DeleteFunc(prev.Environments, func(e controller.EnvRecord) bool {
				return tc.role == lifecycle.RoleAgent || e.Role == tc.role
			})
			leftover, err := fake.Open(context.Background(), controller.EnvSpec{Task: tr.ID, Role: tc.role})
			if err != nil {
				t.Fatal(err)
			}

			if _, err := controller.ResumeFrom(prev, tr, fake); err == nil || !strings.Contains(err.Error(), "died while opening the "+string(tc.role)+" environment") || !strings.Contains(err.Error(), "env close --task t1") {
				t.Errorf("resume without reattach: %v", err)
			}
			r.Provider = controllertest.ReattachingProvider{Provider: fake}
			before := len(fake.Events())
			out, err := r.RunTask(context.Background(), tr, prev)
			if err != nil || out.Status != controller.StatusSucceeded {
				t.Fatalf("resume: %v, status %s\n%s", err, out.Status, strings.Join(fake.Events()[before:], "\n"))
			}
			ev := fake.Events()[before:]
			closeAt := slices.IndexFunc(ev, func(e string) bool { return strings.HasPrefix(e, string(tc.role)+" close retain=false") })
			openAt := slices.IndexFunc(ev, func(e string) bool { return strings.HasPrefix(e, string(tc.role)+" open ") })
			if closeAt < 0 || openAt < closeAt {
				t.Errorf("the cut open's leftover was not closed before the new open:\n%s", strings.Join(ev, "\n"))
			}
			// The cut open's environment closed, the resume's own kept (retain).
			var states []controller.EnvState
			for _, e := range out.Environments {
				if e.ID == leftover.ID() {
					states = append(states, e.State)
				}
			}
			if !slices.Equal(states, []controller.EnvState{controller.EnvClosed, controller.EnvRetained}) {
				t.Errorf("environments %+v, want %s closed (the cut open's), then retained (the resume's)", out.Environments, leftover.ID())
			}
			// The cut open says what became of it: its runner died in it, and this
			// resume removed what it left. It never ended, so no end is made up.
			if s := out.Steps[cut]; s.Status != controller.StepCrashed || s.End != nil ||
				!strings.Contains(s.Error, "runner died during this open") || !strings.Contains(s.Error, "removed what it left") {
				t.Errorf("the cut open recorded %s, end %v (%s); want crashed, no end, saying its runner died and the resume removed what it left", s.Status, s.End, s.Error)
			}
			// The removal is the close step of that environment, under the mode its open
			// was putting in force.
			wantClose := map[lifecycle.Role]string{lifecycle.RoleAgent: "close:ok public",
				lifecycle.RoleEvaluation: "evaluation_close:ok no-network"}[tc.role]
			if s := out.Steps[cut+1]; string(s.Name)+":"+string(s.Status)+" "+string(s.Mode) != wantClose || s.Environment != leftover.ID() {
				t.Errorf("the removal recorded %s:%s %s in %q, want %s in %s", s.Name, s.Status, s.Mode, s.Environment, wantClose, leftover.ID())
			}
		})
	}
}

// TestResumeCutOpenRunningUntilRemoved: a resume that cannot remove what a cut open left
// stops there, and the open still shows running, so that a later resume removes it;
// that one's record then says the open crashed, and the task's outcome is its own steps'.
func TestResumeCutOpenRunningUntilRemoved(t *testing.T) {
	fake := controllertest.New()
	r := newRunner(t, controllertest.ReattachingProvider{Provider: fake})
	tr := task(t, policy.EvaluationFresh)
	prev := cutIn(finishedRecord(t, r, tr), lifecycle.StepEvaluationOpen, lifecycle.RoleEvaluation)
	cut := len(prev.Steps) - 1
	fake.RemoveErr = func(lifecycle.Role) error { return errors.New("fake: engine unreachable") }
	out, err := r.RunTask(context.Background(), tr, prev)
	if err == nil || !strings.Contains(err.Error(), "engine unreachable") {
		t.Fatalf("resume with a failing removal: %v", err)
	}
	if s := readRecord(t, r, tr.ID).Steps[cut]; s.Status != controller.StepRunning || out.Status != controller.StatusRunning {
		t.Fatalf("after the failed removal: cut open %s, task %s; want both still running", s.Status, out.Status)
	}
	fake.RemoveErr = nil
	out, err = r.RunTask(context.Background(), tr, readRecord(t, r, tr.ID))
	if err != nil || out.Status != controller.StatusSucceeded {
		t.Fatalf("second resume: %v, status %s (%s)", err, out.Status, out.Error)
	}
	if s := out.Steps[cut]; s.Status != controller.StepCrashed {
		t.Errorf("the cut open recorded %s, want crashed once removed", s.Status)
	}
	if got := stepsOf(out); slices.Contains(got, "evaluation_open:running") {
		t.Errorf("steps %v: an open still shows running", got)
	}
}

// TestResumeIgnoresARetriedCutOpen: the open a first run died in was removed and run
// again by a resume, which then died in its evaluation open. The first run's open step
// still shows running, but the resume's open superseded it: a later resume must not
// remove the agent environment the resume opened and kept (retain) as that open's
// leftover.
func TestResumeIgnoresARetriedCutOpen(t *testing.T) {
	fake := controllertest.New()
	r := newRunner(t, fake)
	tr := task(t, policy.EvaluationFresh)
	tr.Retain = true
	if _, err := r.RunTask(context.Background(), tr, nil); err != nil {
		t.Fatal(err)
	}
	// cutAt is the record as a runner that died inside the last open step named open
	// left it, without the environments that open and those after it made.
	cutAt := func(rec *controller.Record, open lifecycle.StepName, role lifecycle.Role) *controller.Record {
		rec.Status, rec.Ended = controller.StatusRunning, nil
		cut := slices.IndexFunc(rec.Steps, func(s controller.StepRecord) bool { return s.Name == open && s.Environment != "" })
		rec.Steps = rec.Steps[:cut+1]
		rec.Steps[cut].Status, rec.Steps[cut].End, rec.Steps[cut].Environment = controller.StepRunning, nil, ""
		rec.Environments = slices.DeleteFunc(rec.Environments, func(e controller.EnvRecord) bool {
			return e.Role == role && e.State != controller.EnvClosed || role == lifecycle.RoleAgent
		})
		return rec
	}
	// First run: died in the agent's open, which left the agent environment.
	fake = controllertest.New()
	r.Provider = controllertest.ReattachingProvider{Provider: fake}
	prev := cutAt(readRecord(t, r, tr.ID), lifecycle.StepOpen, lifecycle.RoleAgent)
	if _, err := fake.Open(context.Background(), controller.EnvSpec{Task: tr.ID, Role: lifecycle.RoleAgent}); err != nil {
		t.Fatal(err)
	}
	if out, err := r.RunTask(context.Background(), tr, prev); err != nil || out.Status != controller.StatusSucceeded {
		t.Fatalf("first resume: %v", err)
	}
	// That resume then died in the evaluation open, which left the evaluation environment
	// beside the agent environment it kept.
	prev = cutAt(readRecord(t, r, tr.ID), lifecycle.StepEvaluationOpen, lifecycle.RoleEvaluation)
	if _, err := controller.ResumeFrom(prev, tr, r.Provider); err != nil {
		t.Fatalf("ResumeFrom: %v", err)
	}
	before := len(fake.Events())
	out, err := r.RunTask(context.Background(), tr, prev)
	if err != nil || out.Status != controller.StatusSucceeded {
		t.Fatalf("second resume: %v, status %s\n%s", err, out.Status, strings.Join(fake.Events()[before:], "\n"))
	}
	if ev := fake.Events()[before:]; slices.ContainsFunc(ev, func(e string) bool { return strings.HasPrefix(e, "agent ") }) {
		t.Errorf("the second resume acted on the agent environment:\n%s", strings.Join(ev, "\n"))
	}
	if live := fake.Live(); !slices.Contains(live, "t1") {
		t.Errorf("live environments %v, want the retained agent environment t1 among them", live)
	}
}

// TestResumeRemovesWhatAGoneLeftoverLeft: an environment the record shows open that
// cannot be reattached (a close cut after its sidecar went) may still have objects
// under the name the resume's open needs; a provider that can remove them does so
// before the new open, and the record shows the environment closed.
func TestResumeRemovesWhatAGoneLeftoverLeft(t *testing.T) {
	fake := controllertest.New()
	r, tr, rec := diedDuringEvaluation(t, fake) // the evaluation environment is gone from the engine
	r.Provider = controllertest.ReattachingProvider{Provider: fake}
	// An earlier evaluation environment of the same name, closed by an earlier attempt:
	// its record is history, not the leftover.
	i := slices.IndexFunc(rec.Environments, func(e controller.EnvRecord) bool { return e.Role == lifecycle.RoleEvaluation })
	earlier := rec.Environments[i]
	earlier.State = controller.EnvClosed
	rec.Environments = slices.Insert(rec.Environments, i, earlier)
	before := len(fake.Events())
	out, err := r.RunTask(context.Background(), tr, rec)
	if err != nil || out.Status != controller.StatusSucceeded {
		t.Fatalf("resume: %v, status %s", err, out.Status)
	}
	ev := fake.Events()[before:]
	if i, j := slices.Index(ev, "evaluation remove"), slices.Index(ev, "evaluation open no-network image=grader:1"); i < 0 || j < i {
		t.Errorf("what the gone evaluation environment left was not removed before the new open:\n%s", strings.Join(ev, "\n"))
	}
	if e := out.Environments[i]; e != earlier {
		t.Errorf("the earlier environment's record became %+v", e)
	}
	if e := out.Environments[i+1]; e.State != controller.EnvClosed || !strings.Contains(e.Reach, "not found on resume") {
		t.Errorf("the gone environment recorded %+v, want it closed, not found on resume", e)
	}
}

// TestResumeAfterACancelledResumeOfACutOpen: a resume removed what a cut agent open left
// (the record now holds that environment, closed) and was then cancelled in its own
// open. Nothing ever ran in a sandbox, so a later resume runs the task from the start,
// in shared mode too, instead of refusing it for a lost agent environment.
func TestResumeAfterACancelledResumeOfACutOpen(t *testing.T) {
	fake := controllertest.New()
	r := newRunner(t, controllertest.ReattachingProvider{Provider: fake})
	tr := task(t, policy.EvaluationShared)
	prev := cutIn(finishedRecord(t, r, tr), lifecycle.StepOpen, lifecycle.RoleAgent)
	if _, err := fake.Open(context.Background(), controller.EnvSpec{Task: tr.ID, Role: lifecycle.RoleAgent}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fake.OpenErr = func(lifecycle.Role) error { cancel(); return context.Canceled }
	if out, err := r.RunTask(ctx, tr, prev); err == nil || out.Status != controller.StatusCancelled {
		t.Fatalf("resume cancelled in its open: %v, status %s", err, out.Status)
	}
	fake.OpenErr = nil
	prev = readRecord(t, r, tr.ID)
	if len(prev.Environments) != 1 || prev.Environments[0].State != controller.EnvClosed {
		t.Fatalf("environments %+v, want the cut open's, closed", prev.Environments)
	}
	from, err := controller.ResumeFrom(prev, tr, r.Provider)
	if err != nil || from != lifecycle.StepOpen {
		t.Fatalf("ResumeFrom = %s, %v; want open", from, err)
	}
	if out, err := r.RunTask(context.Background(), tr, prev); err != nil || out.Status != controller.StatusSucceeded {
		t.Fatalf("second resume: %v", err)
	}
}

// TestResumeAfterADiedAgentClose: the runner died while it closed the agent environment
// (fresh mode, step 7), which is gone by the resume. The resume records it closed and
// evaluates; the interrupted close stays running as that run's evidence, and since only
// a step's last attempt counts and no later attempt of it exists, it does not fail the
// task: every step the task needed ended ok.
func TestResumeAfterADiedAgentClose(t *testing.T) {
	fake := controllertest.New()
	tr := task(t, policy.EvaluationFresh)
	r := newRunner(t, fake)
	if _, err := r.RunTask(context.Background(), tr, nil); err != nil {
		t.Fatal(err)
	}
	prev := readRecord(t, r, tr.ID)
	prev.Status, prev.Ended = controller.StatusRunning, nil
	cut := slices.IndexFunc(prev.Steps, func(s controller.StepRecord) bool { return s.Name == lifecycle.StepClose })
	prev.Steps = prev.Steps[:cut+1]
	prev.Steps[cut].Status, prev.Steps[cut].End = controller.StepRunning, nil
	prev.Environments = prev.Environments[:1]
	prev.Environments[0].State = controller.EnvOpen
	r.Provider = controllertest.ReattachingProvider{Provider: fake}

	rec, err := r.RunTask(context.Background(), tr, prev)
	if err != nil || rec.Status != controller.StatusSucceeded {
		t.Fatalf("resume: %v, status %s (%s)", err, rec.Status, rec.Error)
	}
	if got := stepsOf(rec)[cut:]; !slices.Equal(got, []string{"close:running", "evaluation_open:ok",
		"upload_artifacts:ok", "evaluate:ok", "evaluation_close:ok"}) {
		t.Errorf("steps from the cut close: %v", got)
	}
	if e := rec.Environments[0]; e.State != controller.EnvClosed {
		t.Errorf("agent environment %+v, want it recorded closed", e)
	}
}

// TestResumeAfterTheAgentsPart: fresh mode resumes at the evaluation environment once
// every agent step the task declares ended, however it ended: a timed-out rollout counts,
// and a step the task does not declare (skipped) is not waited for.
func TestResumeAfterTheAgentsPart(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*controller.TaskRun)
		status controller.TaskStatus // of the resumed task
	}{
		{"rollout timed out", func(tr *controller.TaskRun) {
			tr.Run = []lifecycle.Command{{"hang"}}
			tr.Timeouts = map[lifecycle.StepName]time.Duration{lifecycle.StepRun: 20 * time.Millisecond}
		}, controller.StatusFailed},
		{"save_artifacts without paths, no harness, no collection", func(tr *controller.TaskRun) {
			tr.Harness, tr.Collect, tr.Artifacts = nil, nil, nil
		}, controller.StatusSucceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := controllertest.New()
			r := newRunner(t, fake)
			tr := task(t, policy.EvaluationFresh)
			tc.change(&tr)
			prev, _ := r.RunTask(ctrlCAtEvaluationOpen(t, fake), tr, nil)
			fake.OpenErr = nil
			if from, err := controller.ResumeFrom(prev, tr, fake); err != nil || from != lifecycle.StepEvaluationOpen {
				t.Fatalf("ResumeFrom: %s, %v; want the evaluation environment's open", from, err)
			}
			rec, _ := r.RunTask(context.Background(), tr, prev)
			if rec.Status != tc.status || !slices.Contains(stepsOf(rec), "evaluate:ok") {
				t.Errorf("resume: status %s (%s), steps %v; want %s, evaluated", rec.Status, rec.Error, stepsOf(rec), tc.status)
			}
		})
	}
}

// TestResumeStopsWhenAGoneLeftoverCannotBeRemoved: what a gone leftover left may hold
// the name the new open needs; a removal that fails stops the resume before any open,
// the leftover stays open in the record, and the task keeps the interrupted run's status.
func TestResumeStopsWhenAGoneLeftoverCannotBeRemoved(t *testing.T) {
	fake := controllertest.New()
	r, tr, rec := diedDuringEvaluation(t, fake)
	r.Provider = controllertest.ReattachingProvider{Provider: fake}
	unreachable := errors.New("engine unreachable")
	fake.RemoveErr = func(lifecycle.Role) error { return unreachable }
	before := len(fake.Events())
	out, err := r.RunTask(context.Background(), tr, rec)
	if !errors.Is(err, unreachable) || out.Status != rec.Status {
		t.Fatalf("resume: %v, status %s; want it stopped by the failed removal, status %s", err, out.Status, rec.Status)
	}
	if ev := fake.Events()[before:]; !slices.Equal(ev, []string{"evaluation remove failed"}) {
		t.Errorf("events %v, want only the failed removal", ev)
	}
	if e := out.Environments[slices.IndexFunc(out.Environments, func(e controller.EnvRecord) bool { return e.Role == lifecycle.RoleEvaluation })]; e.State != controller.EnvOpen {
		t.Errorf("the leftover recorded %+v, want it still open, for a later resume", e)
	}
}

// TestResumeCleanUpOutlastsCtrlC: a Ctrl-C while a resume cleans up after the
// interrupted run does not stop the removal of what that run left (as a close after
// Ctrl-C still runs): the record then says it is closed, and nothing new opens.
func TestResumeCleanUpOutlastsCtrlC(t *testing.T) {
	for _, tc := range []struct {
		name string
		// cancelFirst: Ctrl-C came before the resume began (a cut open has no leftover
		// to look up); otherwise it comes as the resume looks the leftover up.
		cancelFirst bool
		prev        func(t *testing.T, r *controller.Runner, fake *controllertest.Provider, tr controller.TaskRun) *controller.Record
	}{
		{"a gone leftover", false, func(t *testing.T, r *controller.Runner, fake *controllertest.Provider, tr controller.TaskRun) *controller.Record {
			_, _, rec := diedDuringEvaluation(t, fake)
			return rec
		}},
		{"a cut open", true, func(t *testing.T, r *controller.Runner, fake *controllertest.Provider, tr controller.TaskRun) *controller.Record {
			return cutIn(finishedRecord(t, r, tr), lifecycle.StepEvaluationOpen, lifecycle.RoleEvaluation)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := controllertest.New()
			tr := task(t, policy.EvaluationFresh)
			r := newRunner(t, controllertest.ReattachingProvider{Provider: fake})
			prev := tc.prev(t, r, fake, tr)
			r = newRunner(t, controllertest.ReattachingProvider{Provider: fake})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			fake.ReattachErr = func(lifecycle.Role) error { cancel(); return nil }
			if tc.cancelFirst {
				cancel()
			}
			before := len(fake.Events())
			out, _ := r.RunTask(ctx, tr, prev)
			ev := fake.Events()[before:]
			if !slices.Equal(ev, []string{"evaluation remove"}) {
				t.Errorf("events %v, want the removal, and nothing opened", ev)
			}
			for _, e := range out.Environments {
				if e.Role == lifecycle.RoleEvaluation && e.State != controller.EnvClosed {
					t.Errorf("evaluation environment recorded %+v, want closed", e)
				}
			}
		})
	}
}

// ctrlCAtEvaluationOpen makes p's open of an evaluation environment end the returned
// context (Ctrl-C while it opens) and fail with it.
func ctrlCAtEvaluationOpen(t *testing.T, p *controllertest.Provider) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p.OpenErr = func(role lifecycle.Role) error {
		if role == lifecycle.RoleEvaluation {
			cancel()
			return context.Canceled
		}
		return nil
	}
	return ctx
}
