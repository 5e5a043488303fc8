package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// NoticeFile is the restriction statement's name inside a task's output directory.
const NoticeFile = "notice.txt"

// NoticeEnv carries the restriction statement into the run step, for a harness that
// appends it to the agent's final instruction (the rollout copy only).
const NoticeEnv = "COMPASS_NETWORK_RESTRICTION_NOTICE"

// closeRetryDelay is the pause before the one retry of a failed close.
const closeRetryDelay = time.Second

// envState is one open environment and the policy in force in it.
type envState struct {
	env    Environment
	role   lifecycle.Role
	phase  string
	policy policy.Policy
}

// taskRun is one task's lifecycle in progress.
type taskRun struct {
	r       *Runner
	t       TaskRun
	dir     string
	rec     *recorder
	started time.Time

	mu          sync.Mutex
	envs        map[lifecycle.Role]*envState
	current     lifecycle.StepName
	currentMode policy.Mode // the mode the current step runs under, until its environment exists
	stepRole    lifecycle.Role
	blockedDone uint64 // blocked attempts of the phases already summarised
	blockedLive uint64 // blocked attempts of the phase in force, as last polled
	// unresumed is the interrupted run's record when this resume stopped at its
	// leftovers: nothing ran, so the task keeps that run's status, which a later
	// --resume picks up from (as failed, it would be left alone as finished).
	unresumed *Record
	// firstStep is the index of this run's first step: a resumed record holds the
	// interrupted run's steps before it.
	firstStep int
	// status, when set, is the task's final status whatever its steps say (refused).
	status TaskStatus
}

// RunTask runs one task's lifecycle (docs/policy.md §7) and returns its record, which is also in
// <OutDir>/<task>/run_info.json whatever happened. prev, when not nil, is the record of
// an interrupted run that ResumeFrom accepted: the task picks up where it allows.
func (r *Runner) RunTask(ctx context.Context, t TaskRun, prev *Record) (rec *Record, err error) {
	if tl, ok := r.Provider.(TaskLocker); ok {
		unlock, err := tl.LockTask(ctx, t.ID)
		if err != nil {
			if ctx.Err() != nil {
				return r.notStarted(t, prev, ctx.Err())
			}
			return r.refused(t, prev, err)
		}
		// Deferred first, so released last: after the deferred close of every environment.
		defer unlock()
	}
	from := lifecycle.StepOpen
	if prev != nil {
		from, err = ResumeFrom(prev, t, r.Provider)
		if err != nil {
			return prev, err
		}
	}
	tr := &taskRun{r: r, t: t, dir: filepath.Join(r.OutDir, t.ID), started: time.Now(), envs: map[lifecycle.Role]*envState{}}
	tr.rec, err = newRecorder(tr.dir, tr.initialRecord(prev, from))
	if err != nil {
		return nil, err
	}
	if prev != nil {
		tr.firstStep = len(prev.Steps)
	}
	r.logger().Info("task starting", "task", t.ID, "mode", t.Mode, "from", from)
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("controller: task %s: runner panicked: %v", t.ID, p)
			tr.crashRunning(err)
		}
		tr.closeAll(ctx)
		rec = tr.finish(ctx, err)
		if err == nil && rec.Status != StatusSucceeded {
			err = fmt.Errorf("controller: task %s %s: %s", t.ID, rec.Status, rec.Error)
		}
		if werr := tr.rec.writeErr(); werr != nil {
			err = errors.Join(err, werr)
		}
	}()
	if err := tr.writeNotice(); err != nil {
		return nil, err
	}
	if prev != nil {
		if err := tr.closeLeftovers(ctx, prev); err != nil {
			tr.unresumed = prev
			return nil, err
		}
	}
	return nil, tr.lifecycle(ctx, from)
}

// notStarted records a task that the run was cancelled before it could start. A task
// that was to resume keeps its interrupted run's record as it is: it is the evidence of
// what ran, and what a later --resume picks up from.
func (r *Runner) notStarted(t TaskRun, prev *Record, cause error) (*Record, error) {
	if prev != nil {
		return prev, fmt.Errorf("controller: task %s not resumed: %w", t.ID, cause)
	}
	return r.unstarted(t, "", fmt.Errorf("controller: task %s not started: %w", t.ID, cause))
}

// refused records a task whose run lock the runner could not take: another process may
// be running it, so nothing of it is touched, neither its environments nor (for a
// resume) its interrupted run's record, which a later --resume picks up from.
func (r *Runner) refused(t TaskRun, prev *Record, cause error) (*Record, error) {
	if prev != nil {
		return prev, fmt.Errorf("controller: task %s not resumed, nothing of it touched: %w", t.ID, cause)
	}
	return r.unstarted(t, StatusRefused, fmt.Errorf("controller: task %s refused, nothing of it touched: %w", t.ID, cause))
}

// unstarted writes the record of a task that never began, with the status finish gives
// err unless status is set.
func (r *Runner) unstarted(t TaskRun, status TaskStatus, err error) (*Record, error) {
	tr := &taskRun{r: r, t: t, dir: filepath.Join(r.OutDir, t.ID), started: time.Now(), envs: map[lifecycle.Role]*envState{}, status: status}
	rc, rerr := newRecorder(tr.dir, tr.initialRecord(nil, lifecycle.StepOpen))
	if rerr != nil {
		return nil, errors.Join(err, rerr)
	}
	tr.rec = rc
	return tr.finish(context.Background(), err), err
}

// lifecycle runs the rows of the task's table from the given step.
func (tr *taskRun) lifecycle(ctx context.Context, from lifecycle.StepName) error {
	t := tr.t
	if from == lifecycle.StepOpen {
		if err := tr.agentSteps(ctx); err != nil {
			return err
		}
	}
	if t.Mode != policy.EvaluationFresh {
		// Shared: 7 evaluate (restoring the baseline however it ends), 8 close.
		if err := tr.evaluate(ctx, lifecycle.RoleAgent, string(policy.PhaseBaseline), t.Policies.Baseline); err != nil {
			return err
		}
		return tr.closeEnv(ctx, lifecycle.RoleAgent, t.Retain)
	}
	// Fresh: 7 close the agent environment under the run policy, 8 open the evaluation
	// environment under its baseline, 9 evaluate, 10 close it under its baseline.
	if err := tr.closeEnv(ctx, lifecycle.RoleAgent, t.Retain); err != nil {
		return err
	}
	if err := tr.open(ctx, lifecycle.RoleEvaluation, lifecycle.StepEvaluationOpen, t.EvaluationImage, string(policy.PhaseEvaluationBaseline), t.Policies.EvaluationBaseline); err != nil {
		return err
	}
	if err := tr.upload(ctx, lifecycle.RoleEvaluation); err != nil {
		return err
	}
	if err := tr.evaluate(ctx, lifecycle.RoleEvaluation, string(policy.PhaseEvaluationBaseline), t.Policies.EvaluationBaseline); err != nil {
		return err
	}
	return tr.closeEnv(ctx, lifecycle.RoleEvaluation, t.Retain)
}

// agentSteps are rows 1–6 of both tables. A failed set-up (prepare, harness start) ends
// the task; a failed rollout, harness close or collection is recorded and the task goes
// on to evaluation, which judges whatever the agent left.
func (tr *taskRun) agentSteps(ctx context.Context) error {
	t := tr.t
	if err := tr.open(ctx, lifecycle.RoleAgent, lifecycle.StepOpen, t.Image, string(policy.PhaseBaseline), t.Policies.Baseline); err != nil {
		return err
	}
	if err := tr.step(ctx, lifecycle.StepPrepare, lifecycle.RoleAgent, t.Prepare, nil); err != nil {
		return err
	}
	if t.Harness == nil {
		tr.skip(lifecycle.StepHarnessStart, lifecycle.RoleAgent, "no harness session declared")
	} else if err := tr.step(ctx, lifecycle.StepHarnessStart, lifecycle.RoleAgent, t.Harness.Start, nil); err != nil {
		return err
	}
	if err := tr.apply(ctx, lifecycle.RoleAgent, string(policy.PhaseRun), t.Policies.Run); err != nil {
		return err
	}
	var runEnv map[string]string
	if tr.noticeInjected() {
		runEnv = map[string]string{NoticeEnv: t.Notice}
	}
	if err := tolerate(tr.step(ctx, lifecycle.StepRun, lifecycle.RoleAgent, t.Run, runEnv)); err != nil {
		return err
	}
	if t.Harness == nil {
		tr.skip(lifecycle.StepHarnessClose, lifecycle.RoleAgent, "no harness session was started")
	} else if err := tolerate(tr.step(ctx, lifecycle.StepHarnessClose, lifecycle.RoleAgent, t.Harness.Close, nil)); err != nil {
		return err
	}
	if len(t.Collect) == 0 {
		tr.skip(lifecycle.StepCollect, lifecycle.RoleAgent, "no collection commands declared")
	} else if err := tolerate(tr.step(ctx, lifecycle.StepCollect, lifecycle.RoleAgent, t.Collect, nil)); err != nil {
		return err
	}
	switch {
	case !t.SaveArtifacts:
		tr.skip(lifecycle.StepDownload, lifecycle.RoleAgent, "save_artifacts is false")
	case len(t.Artifacts) == 0:
		tr.skip(lifecycle.StepDownload, lifecycle.RoleAgent, "no artifact paths declared")
	default:
		return tolerate(tr.download(ctx, lifecycle.RoleAgent))
	}
	return nil
}

// evaluate is the evaluation scope: switch straight to the evaluation policy, run the
// whole evaluate step, and put the environment's baseline back however the step ends:
// exit status, timeout, cancellation or a panic of this goroutine.
func (tr *taskRun) evaluate(ctx context.Context, role lifecycle.Role, restorePhase string, restore policy.Policy) (err error) {
	if err := tr.apply(ctx, role, string(policy.PhaseEvaluation), tr.t.Policies.Evaluation); err != nil {
		return err
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("controller: evaluate step panicked: %v", p)
		}
		if errors.Is(err, ErrCommandNotStopped) {
			// The cut command may still run, and a baseline (public by default) would
			// give it egress nobody decided on until the close. Nothing more runs, so
			// the environment loses all egress instead.
			restorePhase, restore = PhaseNotStopped, policy.NoNetwork
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tr.r.controlTimeout())
		defer cancel()
		if rerr := tr.apply(rctx, role, restorePhase, restore); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	return tr.step(ctx, lifecycle.StepEvaluate, role, tr.t.Evaluate, nil)
}

// open is row 1 (agent) or row 8 of fresh mode (evaluation): the provider brings the
// environment up with its baseline in force before anything runs in it.
func (tr *taskRun) open(ctx context.Context, role lifecycle.Role, name lifecycle.StepName, image, phase string, p policy.Policy) error {
	idx := tr.beginStep(name, role, "", phase, p.Mode)
	octx, cancel := tr.stepContext(ctx, name)
	defer cancel()
	start := time.Now()
	env, err := tr.r.Provider.Open(octx, EnvSpec{
		Task: tr.t.ID, Role: role, Image: image, Env: tr.t.Env, Baseline: p,
		ProxyStartTimeout: tr.t.ProxyStartTimeout,
	})
	took := time.Since(start)
	if err != nil {
		status := stepStatusOf(ctx, octx, StepError)
		err = fmt.Errorf("controller: open %s environment: %w", role, err)
		tr.endStep(idx, status, nil, err)
		return &stepError{step: name, status: status, err: err}
	}
	tr.mu.Lock()
	tr.envs[role] = &envState{env: env, role: role, phase: phase, policy: p}
	tr.mu.Unlock()
	tr.rec.update(func(r *Record) {
		r.Environments = append(r.Environments, EnvRecord{ID: env.ID(), Role: role, Image: image, State: EnvOpen})
		r.Steps[idx].Environment = env.ID()
		r.Transitions = append(r.Transitions, Transition{
			Time: start, Task: tr.t.ID, Environment: env.ID(), Phase: phase, ToMode: p.Mode,
			Digest: p.Digest(), Duration: took, Parts: map[string]time.Duration{"open": took}, OK: true,
		})
	})
	tr.endStep(idx, StepOK, nil, nil)
	return nil
}

// apply switches the environment's policy and returns once it is in force. The blocked
// summary of the phase that ends is the one the provider took with the swap; a read just
// before the switch stands in when the provider reports none. The lifecycle switches an
// environment only after its open succeeded and before its close.
func (tr *taskRun) apply(ctx context.Context, role lifecycle.Role, phase string, p policy.Policy) error {
	es := tr.envOf(role)
	ended := tr.readBlocked(ctx, es)
	tr.mu.Lock()
	tr.current, tr.stepRole = lifecycle.StepName("switch:"+phase), role
	tr.mu.Unlock()
	tr.report()
	actx, cancel := context.WithTimeout(ctx, tr.r.controlTimeout())
	defer cancel()
	start := time.Now()
	tn, err := applyOnce(actx, es.env, p, PhaseLabel{Phase: phase})
	tn = completeTransition(tn, tr.t.ID, es, phase, p, start, err)
	tr.rec.update(func(r *Record) { r.Transitions = append(r.Transitions, tn) })
	if tn.PreviousBlocked != nil {
		ended.Summary, ended.Error = *tn.PreviousBlocked, ""
	}
	ended.Dropped = tn.PreviousDropped
	tr.recordBlocked(ended)
	tr.mu.Lock()
	if err != nil {
		// A failed switch leaves the environment with no egress at all.
		es.phase, es.policy = "failed_switch", policy.NoNetwork
	} else {
		es.phase, es.policy = phase, p
	}
	tr.mu.Unlock()
	tr.report()
	if err != nil {
		// Never a step's own failure, whatever cut it short (a timeout, Ctrl-C): a failed
		// switch ends the task, and finish tells a cancellation by the run's context.
		return &stepError{step: lifecycle.StepName("switch_" + phase), status: StepError,
			err: fmt.Errorf("controller: switch %s to %s: %w", es.env.ID(), phase, err)}
	}
	tr.r.logger().Info("policy in force", "task", tr.t.ID, "environment", es.env.ID(), "phase", phase,
		"mode", p.Mode, "duration", tn.Duration)
	return nil
}

// completeTransition fills what a provider left out of its transition record.
func completeTransition(tn Transition, task string, es *envState, phase string, p policy.Policy, start time.Time, err error) Transition {
	if tn.Time.IsZero() {
		tn.Time = start
	}
	if tn.Task == "" {
		tn.Task = task
	}
	if tn.Environment == "" {
		tn.Environment = es.env.ID()
	}
	if tn.Phase == "" {
		tn.Phase = phase
	}
	if tn.FromMode == "" {
		tn.FromMode = es.policy.Mode
	}
	if tn.ToMode == "" {
		tn.ToMode = p.Mode
	}
	if tn.Digest == "" {
		tn.Digest = p.Digest()
	}
	if tn.Duration == 0 {
		tn.Duration = time.Since(start)
	}
	tn.OK = err == nil
	if err != nil && tn.Error == "" {
		tn.Error = err.Error()
	}
	return tn
}

// closeEnv closes (or keeps, with retain) an environment under the policy in force:
// the lifecycle has already put the policy the tables name there. It runs even after
// cancellation, since leaving an environment behind is worse than a late close.
func (tr *taskRun) closeEnv(ctx context.Context, role lifecycle.Role, retain bool) error {
	es := tr.envOf(role)
	if es == nil {
		return nil
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tr.r.controlTimeout())
	defer cancel()
	// No switch ends the last phase: its summary and drops are read just before the close.
	last := tr.readBlocked(cctx, es)
	if dc, ok := es.env.(DropCounter); ok {
		var err error
		if last.Dropped, err = dc.TakeDropped(cctx); err != nil {
			if last.Error != "" {
				last.Error += "; "
			}
			last.Error += "dropped: " + err.Error()
		}
	}
	tr.recordBlocked(last)
	name := lifecycle.StepClose
	if role == lifecycle.RoleEvaluation {
		name = lifecycle.StepEvaluationEnd
	}
	idx := tr.beginStep(name, role, es.env.ID(), es.phase, es.policy.Mode)
	err := closeOnce(cctx, es.env, retain)
	if err != nil && cctx.Err() == nil {
		// Close is idempotent: one more try gets past a transient engine error (a
		// network still draining its endpoints) instead of leaving objects behind.
		tr.r.logger().Warn("close failed, retrying", "task", tr.t.ID, "environment", es.env.ID(), "err", err)
		select {
		case <-time.After(closeRetryDelay):
			err = closeOnce(cctx, es.env, retain)
		case <-cctx.Done():
		}
	}
	state, reach := EnvClosed, ""
	if retain {
		state, reach = EnvRetained, reachOf(tr.t.ID, es.env)
	}
	tr.mu.Lock()
	delete(tr.envs, role)
	tr.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("controller: close %s: %w", es.env.ID(), err)
		tr.endStep(idx, StepError, nil, err)
		return &stepError{step: name, status: StepError, err: err}
	}
	tr.rec.update(func(r *Record) {
		for i := range r.Environments {
			// Not closed yet: open, or a leftover an interrupted run kept (see closeLeftovers).
			if r.Environments[i].ID == es.env.ID() && r.Environments[i].State != EnvClosed {
				r.Environments[i].State, r.Environments[i].Reach = state, reach
			}
		}
	})
	tr.endStep(idx, StepOK, nil, nil)
	if reach != "" {
		tr.r.logger().Info("environment retained", "task", tr.t.ID, "environment", es.env.ID(), "reach", reach)
	}
	return nil
}

// applyOnce is Apply with a panic (a provider bug) turned into the failed switch it is:
// the record gets its transition and the environment is taken for one with no egress,
// as Apply promises for a switch that fails however it fails.
func applyOnce(ctx context.Context, env Environment, p policy.Policy, label PhaseLabel) (tn Transition, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("switch panicked: %v", r)
		}
	}()
	return env.Apply(ctx, p, label)
}

// closeOnce is one Close, a panic of which becomes its error: closes also run in
// RunTask's deferred clean-up, where a panic would end the whole run's process and with
// it the clean-up of every other task.
func closeOnce(ctx context.Context, env Environment, retain bool) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("close panicked: %v", p)
		}
	}()
	return env.Close(ctx, retain)
}

// closeAll closes whatever is still open after the lifecycle stopped early, under the
// policy in force: a failed or cancelled task is not given back a broader policy just to
// be torn down.
func (tr *taskRun) closeAll(ctx context.Context) {
	for _, role := range []lifecycle.Role{lifecycle.RoleEvaluation, lifecycle.RoleAgent} {
		if err := tr.closeEnv(ctx, role, tr.t.Retain); err != nil {
			tr.r.logger().Error("close failed", "task", tr.t.ID, "role", role, "err", err)
		}
	}
}

func reachOf(task string, env Environment) string {
	if r, ok := env.(Reacher); ok {
		return r.Reach()
	}
	return fmt.Sprintf("environment %s kept running; `compassctl env status --task %s` shows it, `compassctl env close --task %s` removes it",
		env.ID(), task, task)
}

func (tr *taskRun) envOf(role lifecycle.Role) *envState {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.envs[role]
}

// readBlocked reads the blocked attempts so far of the phase in force in es.
func (tr *taskRun) readBlocked(ctx context.Context, es *envState) PhaseBlocked {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tr.r.controlTimeout())
	defer cancel()
	tr.mu.Lock()
	pb := PhaseBlocked{Environment: es.env.ID(), Phase: es.phase, Mode: es.policy.Mode}
	tr.mu.Unlock()
	sum, err := es.env.Blocked(bctx)
	pb.Summary = sum
	if err != nil {
		pb.Error = err.Error()
	}
	return pb
}

// recordBlocked records the summary of a phase that has ended.
func (tr *taskRun) recordBlocked(pb PhaseBlocked) {
	tr.mu.Lock()
	tr.blockedDone += pb.Summary.Total
	tr.blockedLive = 0
	tr.mu.Unlock()
	tr.rec.update(func(r *Record) { r.Blocked = append(r.Blocked, pb) })
}

func (tr *taskRun) writeNotice() error {
	path := filepath.Join(tr.dir, NoticeFile)
	if !tr.noticeInjected() {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("controller: remove stale notice: %w", err)
		}
		return nil
	}
	if err := os.WriteFile(path, []byte(tr.t.Notice), 0o644); err != nil {
		return fmt.Errorf("controller: write notice: %w", err)
	}
	return nil
}

func (tr *taskRun) noticeInjected() bool { return tr.t.InjectNotice && tr.t.Notice != "" }

func (tr *taskRun) noticeRecord() NoticeRecord {
	switch {
	case tr.noticeInjected():
		return NoticeRecord{Injected: true, Path: NoticeFile}
	case !tr.t.InjectNotice:
		return NoticeRecord{Reason: "inject_network_restriction_notice is false"}
	default:
		return NoticeRecord{Reason: "the run policy is public: no statement"}
	}
}

func (tr *taskRun) initialRecord(prev *Record, from lifecycle.StepName) Record {
	t := tr.t
	if prev != nil {
		// A deep copy: the record's changes (an environment closed) must not reach
		// into the caller's record of the interrupted run through shared slices.
		rec := *cloneRecord(prev)
		rec.Status, rec.Error, rec.Ended = StatusRunning, "", nil
		rec.Resumes = append(rec.Resumes, ResumeRecord{Time: tr.started, From: from})
		return rec
	}
	pols := map[string]policy.Policy{
		string(policy.PhaseBaseline): t.Policies.Baseline, string(policy.PhaseRun): t.Policies.Run, string(policy.PhaseEvaluation): t.Policies.Evaluation,
	}
	if t.Mode == policy.EvaluationFresh {
		pols[string(policy.PhaseEvaluationBaseline)] = t.Policies.EvaluationBaseline
	}
	modes := map[string]policy.Mode{}
	for phase, p := range pols {
		modes[phase+"_network_mode"] = p.Mode
	}
	return Record{
		Version: RecordVersion, Task: t.ID, TaskDigest: t.Digest(), EvaluationMode: t.Mode,
		Status: StatusRunning, Started: tr.started, Phase: lifecycle.StepOpen, Plan: t.Plan,
		Policies: pols, NetworkModes: modes, Notice: tr.noticeRecord(),
		Environments: []EnvRecord{}, Transitions: []Transition{}, Steps: []StepRecord{},
		Blocked: []PhaseBlocked{}, Artifacts: []ArtifactRecord{},
	}
}

// crashRunning ends the steps of this run a panic cut short (a provider's open, download
// or upload: a command's panic is recorded by its step), which would otherwise stay
// "running" in the final record. An interrupted run's step that a resumed record shows
// running is that run's evidence, left as it is (but for a cut open, which says crashed
// once the resume removed what it left: see removeCutOpen).
func (tr *taskRun) crashRunning(err error) {
	now := time.Now()
	tr.rec.update(func(r *Record) {
		for i := tr.firstStep; i < len(r.Steps); i++ {
			if s := &r.Steps[i]; s.Status == StepRunning {
				s.End, s.Duration, s.Status, s.Error = &now, now.Sub(s.Start), StepCrashed, err.Error()
			}
		}
	})
}

// finish sets the task's final status from its steps and the lifecycle's error.
func (tr *taskRun) finish(ctx context.Context, err error) *Record {
	now := time.Now()
	tr.rec.update(func(r *Record) {
		r.Ended = &now
		r.Status = StatusSucceeded
		// Only a step's last attempt counts: a resumed task retries what was cut short.
		last := map[lifecycle.StepName]int{}
		for i, s := range r.Steps {
			last[s.Name] = i
		}
		var failed []string
		for i, s := range r.Steps {
			if last[s.Name] == i && s.Status != StepOK && s.Status != StepSkipped && s.Status != StepRunning {
				failed = append(failed, fmt.Sprintf("%s %s", s.Name, s.Status))
			}
		}
		switch {
		case err != nil && (ctx.Err() != nil || errors.Is(err, context.Canceled)):
			// Only a lifecycle the cancellation cut short: one that ran every step keeps
			// its steps' outcome, though Ctrl-C came while its last environment closed.
			r.Status = StatusCancelled
		case err != nil || len(failed) > 0:
			r.Status = StatusFailed
		}
		switch {
		case err != nil:
			r.Error = err.Error()
		case len(failed) > 0:
			r.Error = fmt.Sprintf("steps not ok: %v", failed)
		}
		if p := tr.unresumed; p != nil {
			r.Status, r.Ended = p.Status, p.Ended
		}
		if tr.status != "" {
			r.Status = tr.status
		}
	})
	rec := tr.rec.snapshot()
	tr.r.progress().Update(ProgressUpdate{Task: tr.t.ID, Step: rec.Phase, Started: tr.started,
		Blocked: rec.BlockedTotal(), Done: true, Ended: now, Status: rec.Status})
	tr.r.logger().Info("task finished", "task", tr.t.ID, "status", rec.Status, "blocked", rec.BlockedTotal())
	return rec
}

func (tr *taskRun) report() {
	tr.mu.Lock()
	u := ProgressUpdate{Task: tr.t.ID, Step: tr.current, Mode: tr.currentMode, Started: tr.started, Blocked: tr.blockedDone + tr.blockedLive}
	if es := tr.envs[tr.stepRole]; es != nil {
		u.Mode = es.policy.Mode
	}
	tr.mu.Unlock()
	tr.r.progress().Update(u)
}
