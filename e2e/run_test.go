// Package e2e tests `compassctl run` against the real Docker Engine: whole lifecycles in
// both modes, their records, Ctrl-C in each phase, a killed runner resumed, and the demo.
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/e2e/harness"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

var h *harness.Harness

func TestMain(m *testing.M) {
	code := harness.Main(m, "run", &h)
	if h != nil && h.Docker != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := removeDemoImages(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "e2e run: remove demo images:", err)
			if code == 0 {
				code = 1
			}
		}
		cancel()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// taskYAML is a demo task whose steps the test chooses; {{ID}} is replaced by a name
// unique to this run.
func taskYAML(id, mode, extra string) string {
	s := fmt.Sprintf(`task_id: %s
provider: docker
evaluation_mode: %s
image: compass-demo-agent:latest
baseline_network_policy: public
run_network_policy: {network_mode: allowlist, allowed_hosts: ["model.test:443"]}
evaluation_network_policy: {network_mode: allowlist, allowed_hosts: ["judge.test"]}
`, id, mode)
	if mode == "fresh" {
		s += "evaluation_image: compass-demo-grader:latest\nevaluation_environment: {baseline_network_policy: no-network}\n"
	}
	return s + extra
}

const normalSteps = `prepare: ["recon exfil.test -o /work/recon.json"]
run: ["agent --model https://model.test/v1/chat --exfil http://exfil.test/upload"]
collect: ["pack /out/result.tar /work/answer.txt"]
artifacts: [/out/result.tar]
`

// TestRunCtrlC interrupts a run in each phase: the run stops, the environments are
// gone, the record says cancelled, and a cut evaluate step still had its baseline
// restored before the close.
func TestRunCtrlC(t *testing.T) {
	demoImages(t)
	t.Parallel()
	tests := []struct {
		name  string
		mode  string
		step  lifecycle.StepName
		steps string
	}{
		{"prepare", "shared", lifecycle.StepPrepare, "prepare: [demo]\nrun: [agent]\nevaluate: [grade]\n"},
		{"run", "shared", lifecycle.StepRun, "run: [demo]\nevaluate: [grade]\n"},
		{"evaluate shared", "shared", lifecycle.StepEvaluate, "run: [\"demo sleep 1ms\"]\nevaluate: [demo]\n"},
		{"evaluate fresh", "fresh", lifecycle.StepEvaluate, "run: [\"demo sleep 1ms\"]\nevaluate: [demo]\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			id := h.Name("int")
			dir := t.TempDir()
			file := writeTask(t, dir, "task.yaml", taskYAML(id, tc.mode, tc.steps))
			r := startRun(t, context.Background(), file, "--out", filepath.Join(dir, "out"))
			taskDir := filepath.Join(dir, "out", id)
			waitPhase(t, r, taskDir, tc.step)
			r.signal(syscall.SIGINT)
			code, out := r.wait(t, 2*time.Minute)
			if code != 1 {
				t.Errorf("exit status %d, want 1:\n%s", code, out)
			}
			rec, err := controller.ReadRecord(taskDir)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Status != controller.StatusCancelled || rec.Ended == nil {
				t.Errorf("record status %s, ended %v", rec.Status, rec.Ended)
			}
			i := slices.IndexFunc(rec.Steps, func(s controller.StepRecord) bool { return s.Name == tc.step })
			if i < 0 || rec.Steps[i].Status != controller.StepCancelled {
				t.Errorf("step %s not recorded as cancelled: %+v", tc.step, rec.Steps)
			}
			for _, e := range rec.Environments {
				if e.State != controller.EnvClosed {
					t.Errorf("environment %s is %s:\n%s", e.ID, e.State, diagnose(taskDir))
				}
			}
			if tc.step == lifecycle.StepEvaluate {
				last := rec.Transitions[len(rec.Transitions)-1]
				wantPhase := map[string]string{"shared": "baseline", "fresh": "evaluation_baseline"}[tc.mode]
				if !last.OK || last.Phase != wantPhase {
					t.Errorf("last transition %+v, want the %s restore", last, wantPhase)
				}
			}
			if left := taskLeftovers(t, id); len(left) > 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

// TestRunEvaluateEndings ends the evaluate step with a non-zero exit and with its
// timeout: either way the baseline comes back before the environment is closed.
func TestRunEvaluateEndings(t *testing.T) {
	demoImages(t)
	t.Parallel()
	tests := []struct {
		name   string
		steps  string
		status controller.StepStatus
	}{
		{"non-zero exit", "evaluate: [\"grade --judge http://judge.test/ /no/such/archive\"]\n", controller.StepFailed},
		{"timeout", "evaluate: [demo]\ntimeouts: {evaluate: 2s}\n", controller.StepTimedOut},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			id := h.Name("end")
			dir := t.TempDir()
			file := writeTask(t, dir, "task.yaml", taskYAML(id, "shared", "run: [\"demo sleep 1ms\"]\n"+tc.steps))
			code, out := startRun(t, context.Background(), file, "--out", filepath.Join(dir, "out")).wait(t, 3*time.Minute)
			if code != 1 {
				t.Errorf("exit status %d, want 1:\n%s", code, out)
			}
			rec, err := controller.ReadRecord(filepath.Join(dir, "out", id))
			if err != nil {
				t.Fatal(err)
			}
			var phases []string
			for _, tn := range rec.Transitions {
				if !tn.OK {
					t.Errorf("transition failed: %+v", tn)
				}
				phases = append(phases, tn.Phase+":"+string(tn.ToMode))
			}
			want := []string{"baseline:public", "run:allowlist", "evaluation:allowlist", "baseline:public"}
			if !slices.Equal(phases, want) {
				t.Errorf("transitions %v, want %v", phases, want)
			}
			i := slices.IndexFunc(rec.Steps, func(s controller.StepRecord) bool { return s.Name == lifecycle.StepEvaluate })
			if i < 0 || rec.Steps[i].Status != tc.status {
				t.Errorf("evaluate step: %+v", rec.Steps)
			}
			if last := rec.Steps[len(rec.Steps)-1]; last.Name != lifecycle.StepClose || last.Mode != "public" || last.Status != controller.StepOK {
				t.Errorf("close step %+v, want ok under public", last)
			}
			if left := taskLeftovers(t, id); len(left) > 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

// TestRunResumeAfterKill kills the runner (SIGKILL: no clean-up at all) during a fresh
// task's evaluation; --resume closes the evaluation environment it left and evaluates
// again in a new one. The same kill in shared mode makes --resume refuse, with the reason.
func TestRunResumeAfterKill(t *testing.T) {
	demoImages(t)
	t.Parallel()
	for _, mode := range []string{"fresh", "shared"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			id := h.Name("kill")
			dir := t.TempDir()
			out := filepath.Join(dir, "out")
			file := writeTask(t, dir, "task.yaml", taskYAML(id, mode, normalSteps+
				"evaluate: [\"demo sleep 3s\", \"grade --judge http://judge.test/grade /out/result.tar\"]\n"))
			r := startRun(t, context.Background(), file, "--out", out)
			waitPhase(t, r, filepath.Join(out, id), lifecycle.StepEvaluate)
			r.signal(syscall.SIGKILL)
			r.wait(t, time.Minute)

			code, text := startRun(t, context.Background(), file, "--out", out, "--resume").wait(t, 3*time.Minute)
			rec, err := controller.ReadRecord(filepath.Join(out, id))
			if err != nil {
				t.Fatal(err)
			}
			if mode == "shared" {
				if code != 2 || !strings.Contains(text, "cannot resume task "+id) || !strings.Contains(text, "shared mode") {
					t.Errorf("resume of shared task: exit %d:\n%s", code, text)
				}
				// Clean up what the killed run left, as the refusal tells the operator to.
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if out, err := h.Compassctl(ctx, "env", "close", "--task", id).CombinedOutput(); err != nil {
					t.Errorf("env close: %v\n%s", err, out)
				}
				return
			}
			if code != 0 || rec.Status != controller.StatusSucceeded {
				t.Fatalf("resume: exit %d, status %s (%s):\n%s", code, rec.Status, rec.Error, text)
			}
			checkResumed(t, rec, id, lifecycle.StepEvaluationOpen)
		})
	}
}

// TestRunResumeAfterKillInOpen kills the runner inside the agent environment's open, once
// the task's first Docker object exists: the resume removes what that open left (the new
// open needs its names; Docker refused them, and the task ended failed) and runs the task
// from the start.
func TestRunResumeAfterKillInOpen(t *testing.T) {
	demoImages(t)
	t.Parallel()
	id := h.Name("killopen")
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	file := writeTask(t, dir, "task.yaml", taskYAML(id, "shared", "run: [\"demo sleep 1ms\"]\nevaluate: [\"demo sleep 1ms\"]\n"))
	r := startRun(t, context.Background(), file, "--out", out)
	for deadline := time.Now().Add(2 * time.Minute); len(taskLeftovers(t, id)) == 0; {
		select {
		case <-r.done:
			t.Fatalf("compassctl run ended before it created anything:\n%s", r.out.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Docker object of task %s appeared:\n%s", id, r.out.String())
		}
	}
	r.signal(syscall.SIGKILL)
	r.wait(t, time.Minute)
	prev, err := controller.ReadRecord(filepath.Join(out, id))
	if err != nil {
		t.Fatal(err)
	}
	if last := prev.Steps[len(prev.Steps)-1]; last.Name != lifecycle.StepOpen || last.Status != controller.StepRunning || len(prev.Environments) != 0 {
		t.Fatalf("the kill did not land inside the open: last step %s %s, environments %+v", last.Name, last.Status, prev.Environments)
	}
	left := settledLeftovers(t, id)
	if len(left) == 0 {
		t.Fatal("the killed open left nothing behind to resume past")
	}

	code, text := startRun(t, context.Background(), file, "--out", out, "--resume").wait(t, 3*time.Minute)
	rec, err := controller.ReadRecord(filepath.Join(out, id))
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 || rec.Status != controller.StatusSucceeded {
		t.Fatalf("resume past %v: exit %d, status %s (%s):\n%s", left, code, rec.Status, rec.Error, text)
	}
	if len(rec.Environments) != 2 {
		t.Errorf("environments %+v, want the killed open's and the resume's", rec.Environments)
	}
	if cut := rec.Steps[0]; cut.Name != lifecycle.StepOpen || cut.Status != controller.StepCrashed || cut.End != nil {
		t.Errorf("the killed open's step is %s %s (end %v), want open crashed with no end", cut.Name, cut.Status, cut.End)
	}
	checkResumed(t, rec, id, lifecycle.StepOpen)
}

// TestRunRefusesATaskAnotherRunHolds runs a task while a second run, into another output
// directory, reaches the same task: the second leaves it alone (refused, nothing of it
// touched) and runs its other task; the first finishes as if alone; once it has, a
// --resume of the second runs the task.
func TestRunRefusesATaskAnotherRunHolds(t *testing.T) {
	demoImages(t)
	t.Parallel()
	id, other := h.Name("held"), h.Name("free")
	dir := t.TempDir()
	outA, outB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	held := writeTask(t, dir, "held.yaml", taskYAML(id, "shared", "run: [demo]\nevaluate: [\"demo sleep 1ms\"]\n"))
	a := startRun(t, context.Background(), held, "--out", outA)
	waitPhase(t, a, filepath.Join(outA, id), lifecycle.StepRun)
	before := taskLeftovers(t, id)

	quick := writeTask(t, dir, "quick.yaml", taskYAML(id, "shared", "run: [\"demo sleep 1ms\"]\nevaluate: [\"demo sleep 1ms\"]\n"))
	free := writeTask(t, dir, "free.yaml", taskYAML(other, "shared", "run: [\"demo sleep 1ms\"]\nevaluate: [\"demo sleep 1ms\"]\n"))
	code, text := startRun(t, context.Background(), quick, free, "--out", outB).wait(t, 3*time.Minute)
	if code != 1 {
		t.Errorf("second run: exit %d, want 1 (a task did not succeed):\n%s", code, text)
	}
	recB, err := controller.ReadRecord(filepath.Join(outB, id))
	if err != nil {
		t.Fatal(err)
	}
	if recB.Status != controller.StatusRefused || len(recB.Steps) != 0 || len(recB.Environments) != 0 ||
		!strings.Contains(recB.Error, "another compassctl run holds the task") || !strings.Contains(recB.Error, ".run-locks") {
		t.Errorf("second run's record of the held task: status %s, %d steps, %d environments, error %q; want refused, untouched, naming the run lock",
			recB.Status, len(recB.Steps), len(recB.Environments), recB.Error)
	}
	if rec, err := controller.ReadRecord(filepath.Join(outB, other)); err != nil || rec.Status != controller.StatusSucceeded {
		t.Errorf("second run's other task: %v %+v", err, rec)
	}
	after := taskLeftovers(t, id)
	slices.Sort(before)
	slices.Sort(after)
	if !slices.Equal(before, after) {
		t.Errorf("the second run touched the first's environment: %v, then %v", before, after)
	}

	a.signal(syscall.SIGINT)
	a.wait(t, 2*time.Minute)
	if left := taskLeftovers(t, id); len(left) > 0 {
		t.Fatalf("the first run left %v", left)
	}
	code, text = startRun(t, context.Background(), quick, free, "--out", outB, "--resume").wait(t, 3*time.Minute)
	recB, err = controller.ReadRecord(filepath.Join(outB, id))
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 || recB.Status != controller.StatusSucceeded {
		t.Fatalf("resume of the refused task once the first run ended: exit %d, status %s (%s):\n%s", code, recB.Status, recB.Error, text)
	}
	checkResumed(t, recB, id, lifecycle.StepOpen)
}

// checkResumed checks a resumed task's record and the engine: one resume, from the step
// given, every environment closed, nothing of the task left.
func checkResumed(t *testing.T, rec *controller.Record, id string, from lifecycle.StepName) {
	t.Helper()
	if len(rec.Resumes) != 1 || rec.Resumes[0].From != from {
		t.Errorf("resumes %+v, want one from %s", rec.Resumes, from)
	}
	for _, e := range rec.Environments {
		if e.State != controller.EnvClosed {
			t.Errorf("environment %s is %s", e.ID, e.State)
		}
	}
	if left := taskLeftovers(t, id); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestRunRetain keeps the environment: it is still there after the run, the summary says
// how to reach it, and `compassctl env close` removes it.
func TestRunRetain(t *testing.T) {
	demoImages(t)
	t.Parallel()
	id := h.Name("keep")
	dir := t.TempDir()
	file := writeTask(t, dir, "task.yaml", taskYAML(id, "shared", "run: [\"demo sleep 1ms\"]\nevaluate: [\"demo sleep 1ms\"]\nretain: true\n"))
	code, out := startRun(t, context.Background(), file, "--out", filepath.Join(dir, "out")).wait(t, 3*time.Minute)
	if code != 0 || !strings.Contains(out, id+": retained "+id+": docker exec -it ") {
		t.Errorf("exit %d, want 0 and how to reach the environment:\n%s", code, out)
	}
	rec, err := controller.ReadRecord(filepath.Join(dir, "out", id))
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Environments) != 1 || rec.Environments[0].State != controller.EnvRetained {
		t.Errorf("environments %+v", rec.Environments)
	}
	if left := taskLeftovers(t, id); len(left) < 2 {
		t.Errorf("retained environment not found: %v", left)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := h.Compassctl(ctx, "env", "close", "--task", id).CombinedOutput(); err != nil {
		t.Errorf("env close: %v\n%s", err, out)
	}
	if left := taskLeftovers(t, id); len(left) > 0 {
		t.Errorf("left behind after env close: %v", left)
	}
}

// TestRunStepConditions checks the conditional rows on Docker: steps 3 and 5 with a
// harness session, step 6 without collection commands, a timed-out rollout (its process
// is gone when evaluation starts: `demo procs` fails otherwise), and a download whose
// path does not resolve (recorded, and the task still evaluated).
func TestRunStepConditions(t *testing.T) {
	demoImages(t)
	t.Parallel()
	tests := []struct {
		name   string
		steps  string
		want   []string
		status controller.TaskStatus
	}{
		{"harness session", "harness: {start: [\"demo sleep 1ms\"], close: [\"demo sleep 1ms\"]}\nrun: [\"demo sleep 1ms\"]\nevaluate: [\"demo sleep 1ms\"]\n",
			[]string{"open:ok", "prepare:ok", "harness_start:ok", "run:ok", "harness_close:ok", "collect:skipped", "download:skipped", "evaluate:ok", "close:ok"},
			controller.StatusSucceeded},
		{"a timed-out rollout is stopped before evaluation", "run: [demo]\ntimeouts: {run: 2s}\nevaluate: [\"demo procs\"]\n",
			[]string{"open:ok", "prepare:ok", "harness_start:skipped", "run:timed_out", "harness_close:skipped", "collect:skipped", "download:skipped", "evaluate:ok", "close:ok"},
			controller.StatusFailed},
		{"artifact path that does not resolve", "run: [\"demo sleep 1ms\"]\nartifacts: [/no/such/file]\nevaluate: [\"demo sleep 1ms\"]\n",
			[]string{"open:ok", "prepare:ok", "harness_start:skipped", "run:ok", "harness_close:skipped", "collect:skipped", "download:failed", "evaluate:ok", "close:ok"},
			controller.StatusFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			id := h.Name("cond")
			dir := t.TempDir()
			file := writeTask(t, dir, "task.yaml", taskYAML(id, "shared", tc.steps))
			_, out := startRun(t, context.Background(), file, "--out", filepath.Join(dir, "out")).wait(t, 3*time.Minute)
			rec, err := controller.ReadRecord(filepath.Join(dir, "out", id))
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			var got []string
			for _, s := range rec.Steps {
				got = append(got, string(s.Name)+":"+string(s.Status))
			}
			if !slices.Equal(got, tc.want) || rec.Status != tc.status {
				t.Errorf("steps %v (%s), want %v (%s)\n%s", got, rec.Status, tc.want, tc.status, out)
			}
			for _, a := range rec.Artifacts {
				if a.Saved || a.Error == "" {
					t.Errorf("artifact %+v should be recorded as not saved, with the error", a)
				}
			}
		})
	}
}

// TestRunSecondCtrlC: a second Ctrl-C abandons the clean-up at once (exit 130); what is
// left is for `compassctl env close`, and the record says the task was not finished.
func TestRunSecondCtrlC(t *testing.T) {
	demoImages(t)
	t.Parallel()
	id := h.Name("abandon")
	dir := t.TempDir()
	file := writeTask(t, dir, "task.yaml", taskYAML(id, "shared", "run: [demo]\nevaluate: [\"demo sleep 1ms\"]\n"))
	r := startRun(t, context.Background(), file, "--out", filepath.Join(dir, "out"))
	waitPhase(t, r, filepath.Join(dir, "out", id), lifecycle.StepRun)
	r.signal(syscall.SIGINT)
	// Go merges a signal that arrives before the first of its kind was taken: the second
	// goes only once compassctl has said it took the first.
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(r.out.String(), "again to abandon them") {
		if time.Now().After(deadline) {
			t.Fatalf("no word of the first interrupt:\n%s", r.out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.signal(syscall.SIGINT)
	code, out := r.wait(t, time.Minute)
	if code != 130 || !strings.Contains(out, "abandoned") {
		t.Errorf("exit %d, want 130 and the abandon message:\n%s", code, out)
	}
	if rec, err := controller.ReadRecord(filepath.Join(dir, "out", id)); err != nil || controller.Finished(rec) {
		t.Errorf("record %+v, %v: want an unfinished task", rec, err)
	}
	// The abandoned clean-up may still be under way in Docker ("removal already in
	// progress"): close until it succeeds. Each try has its own deadline, so a try that
	// hangs is told apart from tries that keep failing.
	closeUntilDone(t, id, time.Minute)
	if left := taskLeftovers(t, id); len(left) > 0 {
		t.Errorf("left behind after env close: %v", left)
	}
}
