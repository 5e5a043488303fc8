package controller_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/controllertest"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// locking is a provider with run locks over locks, on the engine fake.
func locking(fake *controllertest.Provider, locks *controllertest.Locks) controllertest.LockingProvider {
	return controllertest.LockingProvider{ReattachingProvider: controllertest.ReattachingProvider{Provider: fake}, Locks: locks}
}

// cutIn makes a finished record of tr look like a runner that died inside the last open
// step named open: that step running, no environment from it on.
func cutIn(rec *controller.Record, open lifecycle.StepName, role lifecycle.Role) *controller.Record {
	rec.Status, rec.Ended = controller.StatusRunning, nil
	cut := slices.IndexFunc(rec.Steps, func(s controller.StepRecord) bool { return s.Name == open })
	rec.Steps = rec.Steps[:cut+1]
	rec.Steps[cut].Status, rec.Steps[cut].End, rec.Steps[cut].Environment = controller.StepRunning, nil, ""
	rec.Environments = slices.DeleteFunc(rec.Environments, func(e controller.EnvRecord) bool {
		return role == lifecycle.RoleAgent || e.Role == role
	})
	return rec
}

// finishedRecord runs tr to its end on a provider of its own and returns its record.
func finishedRecord(t *testing.T, r *controller.Runner, tr controller.TaskRun) *controller.Record {
	t.Helper()
	own := *r
	own.Provider = controllertest.New()
	if _, err := own.RunTask(context.Background(), tr, nil); err != nil {
		t.Fatal(err)
	}
	return readRecord(t, r, tr.ID)
}

// TestRunLockSpansTheTask: the runner takes the task's run lock before the first thing
// it does to any environment (an open, or removing what a cut open left) and lets it go
// only after the last close, the deferred closes of a failed task included.
func TestRunLockSpansTheTask(t *testing.T) {
	tests := []struct {
		name  string
		mode  policy.EvaluationMode
		setup func(t *testing.T, r *controller.Runner, fake *controllertest.Provider, tr *controller.TaskRun) *controller.Record
		ok    bool
	}{
		{"shared", policy.EvaluationShared, nil, true},
		{"fresh", policy.EvaluationFresh, nil, true},
		{"prepare fails: closed after the lifecycle stopped", policy.EvaluationShared,
			func(_ *testing.T, _ *controller.Runner, _ *controllertest.Provider, tr *controller.TaskRun) *controller.Record {
				tr.Prepare = []lifecycle.Command{{"exit", "3"}}
				return nil
			}, false},
		{"resume after a cut agent open", policy.EvaluationShared,
			func(t *testing.T, r *controller.Runner, fake *controllertest.Provider, tr *controller.TaskRun) *controller.Record {
				prev := cutIn(finishedRecord(t, r, *tr), lifecycle.StepOpen, lifecycle.RoleAgent)
				if _, err := fake.Open(context.Background(), controller.EnvSpec{Task: tr.ID, Role: lifecycle.RoleAgent}); err != nil {
					t.Fatal(err)
				}
				return prev
			}, true},
		{"resume with an evaluation environment left open", policy.EvaluationFresh,
			func(t *testing.T, r *controller.Runner, fake *controllertest.Provider, tr *controller.TaskRun) *controller.Record {
				prev := finishedRecord(t, r, *tr)
				prev.Status, prev.Ended = controller.StatusRunning, nil
				prev.Steps = prev.Steps[:len(prev.Steps)-2]
				for i := range prev.Environments {
					if prev.Environments[i].Role == lifecycle.RoleEvaluation {
						prev.Environments[i].State = controller.EnvOpen
					}
				}
				if _, err := fake.Open(context.Background(), controller.EnvSpec{Task: tr.ID, Role: lifecycle.RoleEvaluation}); err != nil {
					t.Fatal(err)
				}
				return prev
			}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fake, locks := controllertest.New(), controllertest.NewLocks()
			r := newRunner(t, locking(fake, locks))
			tr := task(t, tc.mode)
			var prev *controller.Record
			if tc.setup != nil {
				prev = tc.setup(t, r, fake, &tr)
			}
			before := len(fake.Events())
			rec, err := r.RunTask(context.Background(), tr, prev)
			if (err == nil) != tc.ok {
				t.Fatalf("RunTask: %v, status %s", err, rec.Status)
			}
			ev := fake.Events()[before:]
			if len(ev) < 3 || ev[0] != "lock t1" || ev[len(ev)-1] != "unlock t1" {
				t.Errorf("the run lock does not span the task:\n%s", strings.Join(ev, "\n"))
			}
			if !slices.ContainsFunc(ev, func(e string) bool { return strings.Contains(e, " close ") }) {
				t.Errorf("no close between lock and unlock:\n%s", strings.Join(ev, "\n"))
			}
			if !locks.Hold("t1") {
				t.Error("the run lock is still held after the task")
			}
		})
	}
}

// TestRunLockRefusesASecondRun: another process (a run into another --out) holds task
// t1 and its live environments. This run touches nothing of t1: no open beside them, no
// removal or reattachment for a resume, and an interrupted record it was to resume from
// stays as it was. It records t1 refused, naming the task and the lock, and goes on
// with its other tasks; once the other run is over, --resume runs t1 from the start.
func TestRunLockRefusesASecondRun(t *testing.T) {
	tests := []struct {
		name string
		mode policy.EvaluationMode
		// prev makes the record the refused run was to resume from (nil: a fresh run).
		prev func(t *testing.T, r *controller.Runner, tr controller.TaskRun) *controller.Record
	}{
		{"fresh run", policy.EvaluationShared, nil},
		{"resume after a cut open", policy.EvaluationShared, func(t *testing.T, r *controller.Runner, tr controller.TaskRun) *controller.Record {
			return cutIn(finishedRecord(t, r, tr), lifecycle.StepOpen, lifecycle.RoleAgent)
		}},
		{"resume after a cut evaluation open", policy.EvaluationFresh, func(t *testing.T, r *controller.Runner, tr controller.TaskRun) *controller.Record {
			return cutIn(finishedRecord(t, r, tr), lifecycle.StepEvaluationOpen, lifecycle.RoleEvaluation)
		}},
		{"resume with an environment left open", policy.EvaluationFresh, func(t *testing.T, r *controller.Runner, tr controller.TaskRun) *controller.Record {
			prev := finishedRecord(t, r, tr)
			prev.Status, prev.Ended = controller.StatusRunning, nil
			prev.Steps = prev.Steps[:len(prev.Steps)-2]
			for i := range prev.Environments {
				prev.Environments[i].State = controller.EnvOpen
			}
			return prev
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fake, locks := controllertest.New(), controllertest.NewLocks()
			tr := task(t, tc.mode)
			// The other run: its lock on t1 and its environments of t1, live.
			if !locks.Hold(tr.ID) {
				t.Fatal("lock already held")
			}
			for _, role := range []lifecycle.Role{lifecycle.RoleAgent, lifecycle.RoleEvaluation} {
				if _, err := fake.Open(context.Background(), controller.EnvSpec{Task: tr.ID, Role: role}); err != nil {
					t.Fatal(err)
				}
			}
			live := fake.Live()
			r := newRunner(t, locking(fake, locks))
			var prev *controller.Record
			var onDisk []byte
			if tc.prev != nil {
				prev = tc.prev(t, r, tr)
				if _, err := controller.ResumeFrom(prev, tr, r.Provider); err != nil {
					t.Fatalf("ResumeFrom: %v", err)
				}
				b, err := os.ReadFile(filepath.Join(r.OutDir, tr.ID, controller.RecordFile))
				if err != nil {
					t.Fatal(err)
				}
				onDisk = b
			}
			before := len(fake.Events())
			rec, err := r.RunTask(context.Background(), tr, prev)
			if ev := fake.Events()[before:]; !slices.Equal(ev, []string{"lock t1 refused"}) {
				t.Errorf("events, want only the refused lock:\n%s", strings.Join(ev, "\n"))
			}
			for _, id := range live {
				if !slices.Contains(fake.Live(), id) {
					t.Errorf("the other run's environment %s was closed", id)
				}
			}
			if !errors.Is(err, controller.ErrTaskLocked) {
				t.Fatalf("t1: %v, want it refused for the lock", err)
			}
			for _, want := range []string{"task t1", "another compassctl run holds", "fake-locks/t1"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("t1's error %q does not say %q", err, want)
				}
			}
			// In a run of several tasks, the others go on.
			other := tr
			other.ID = "t2"
			outs := r.RunAll(context.Background(), []controller.TaskRun{tr, other}, 1, map[string]*controller.Record{tr.ID: prev})
			if !errors.Is(outs[0].Err, controller.ErrTaskLocked) {
				t.Errorf("t1 in RunAll: %v, want it refused for the lock", outs[0].Err)
			}
			if outs[1].Err != nil || outs[1].Record.Status != controller.StatusSucceeded {
				t.Errorf("t2: %v, want it run beside the refused t1", outs[1].Err)
			}
			disk := readRecord(t, r, tr.ID)
			if prev != nil {
				b, err := os.ReadFile(filepath.Join(r.OutDir, tr.ID, controller.RecordFile))
				if err != nil {
					t.Fatal(err)
				}
				if string(b) != string(onDisk) || rec != prev {
					t.Errorf("the refused resume changed the interrupted run's record:\n%s", b)
				}
				return
			}
			if rec.Status != controller.StatusRefused || disk.Status != controller.StatusRefused || !strings.Contains(disk.Error, "fake-locks/t1") ||
				len(disk.Steps) != 0 || len(disk.Environments) != 0 {
				t.Errorf("t1's record: status %s (%s), steps %v, environments %v; want refused, naming the lock, nothing run",
					disk.Status, disk.Error, stepsOf(disk), disk.Environments)
			}
			if controller.Finished(disk) {
				t.Error("a refused task counts as finished: --resume would leave it alone")
			}
			// The other run ended (its environments gone, its lock let go): --resume runs
			// the refused task from the start.
			for _, role := range []lifecycle.Role{lifecycle.RoleAgent, lifecycle.RoleEvaluation} {
				e, err := controllertest.ReattachingProvider{Provider: fake}.Reattach(context.Background(), tr.ID, role)
				if err != nil {
					t.Fatal(err)
				}
				if err := e.Close(context.Background(), false); err != nil {
					t.Fatal(err)
				}
			}
			locks.Release(tr.ID)
			from, err := controller.ResumeFrom(disk, tr, r.Provider)
			if err != nil || from != lifecycle.StepOpen {
				t.Fatalf("ResumeFrom the refused record: %s, %v; want the start", from, err)
			}
			if rec, err := r.RunTask(context.Background(), tr, disk); err != nil || rec.Status != controller.StatusSucceeded {
				t.Errorf("resume of the refused task: %v", err)
			}
		})
	}
}

// cancellingLocker is a provider whose run lock is still being taken when Ctrl-C comes:
// LockTask fails with the run's cancellation, as the Docker provider's flock wait does.
type cancellingLocker struct {
	*controllertest.Provider
	cancel func()
}

func (p cancellingLocker) LockTask(ctx context.Context, task string) (func(), error) {
	p.cancel()
	return nil, fmt.Errorf("fake: task %s: run lock: %w", task, ctx.Err())
}

// TestRunLockCutByCancellation: a Ctrl-C while the run lock is being taken is a
// cancellation, not a refusal: the task is recorded cancelled (nothing held it), and a
// task that was to resume keeps its interrupted run's record as it was.
func TestRunLockCutByCancellation(t *testing.T) {
	for _, resume := range []bool{false, true} {
		t.Run(fmt.Sprintf("resume=%t", resume), func(t *testing.T) {
			fake := controllertest.New()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r := newRunner(t, cancellingLocker{fake, cancel})
			tr := task(t, policy.EvaluationShared)
			var prev *controller.Record
			var onDisk []byte
			if resume {
				prev = cutIn(finishedRecord(t, r, tr), lifecycle.StepOpen, lifecycle.RoleAgent)
				b, err := os.ReadFile(filepath.Join(r.OutDir, tr.ID, controller.RecordFile))
				if err != nil {
					t.Fatal(err)
				}
				onDisk = b
			}
			rec, err := r.RunTask(ctx, tr, prev)
			if !errors.Is(err, context.Canceled) || errors.Is(err, controller.ErrTaskLocked) {
				t.Fatalf("RunTask: %v, want the cancellation", err)
			}
			if len(fake.Events()) != 0 {
				t.Errorf("events: %v, want none", fake.Events())
			}
			if resume {
				b, err := os.ReadFile(filepath.Join(r.OutDir, tr.ID, controller.RecordFile))
				if err != nil {
					t.Fatal(err)
				}
				if rec != prev || string(b) != string(onDisk) {
					t.Errorf("the cancelled resume changed the interrupted run's record:\n%s", b)
				}
				return
			}
			disk := readRecord(t, r, tr.ID)
			if rec.Status != controller.StatusCancelled || disk.Status != controller.StatusCancelled || len(disk.Steps) != 0 {
				t.Errorf("record: status %s (%s), steps %v; want cancelled, nothing run", disk.Status, disk.Error, stepsOf(disk))
			}
		})
	}
}
