package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// Finished reports whether a record shows a lifecycle that ran to its end (whatever
// its outcome): --resume leaves such a task alone.
func Finished(rec *Record) bool {
	return rec.Ended != nil && (rec.Status == StatusSucceeded || rec.Status == StatusFailed)
}

// ResumeFrom decides where an interrupted task (cancelled, or its runner died) picks up.
// What is safe to resume:
//   - nothing ran in a sandbox yet (no agent environment came up: no open ended ok):
//     start from the top;
//   - fresh mode, once the agent's part is over (rollout, collection and artifact
//     download all ended): the evaluation environment is new by design, so the task
//     resumes at opening it, with the saved artifacts;
//   - anything else is refused, because the agent environment's state (what prepare
//     installed, what the agent changed) lives only in that environment and cannot be
//     reproduced; the error says why and what to do.
//
// The interrupted run's leftovers must be closed first: the provider must be able to
// reattach them (Reattacher), and to remove what an open its runner died in left
// (Remover), otherwise the resume is refused.
func ResumeFrom(prev *Record, t TaskRun, p Provider) (lifecycle.StepName, error) {
	refuse := func(format string, args ...any) (lifecycle.StepName, error) {
		return "", fmt.Errorf("controller: cannot resume task %s: %s", t.ID, fmt.Sprintf(format, args...))
	}
	switch {
	case prev.Task != t.ID:
		return refuse("the record is of task %q", prev.Task)
	case prev.TaskDigest == "":
		// Nothing to compare the definition with: a record of any definition would pass.
		return refuse("the record has no task_digest, so the task definition cannot be checked against it; run it without --resume")
	case prev.TaskDigest != t.Digest():
		return refuse("the task definition changed since the record was written; run it without --resume")
	case Finished(prev):
		return refuse("it already finished (%s); nothing to resume", prev.Status)
	}
	if cut := cutOpens(prev); len(cut) > 0 {
		if _, ok := p.(Remover); !ok {
			return refuse("its runner died while opening the %s environment, which may have left that environment's objects, and provider %s cannot remove them; close them (`compassctl env close --task %s`), or run without --resume",
				cut[0].Role, p.Name(), t.ID)
		}
	}
	if !stepOK(prev, lifecycle.StepOpen) {
		// No agent environment ever came up (none opened, or only opens that failed or
		// were cut, whose leftovers the resume removes first): nothing ran in a sandbox.
		return lifecycle.StepOpen, nil
	}
	if t.Mode != policy.EvaluationFresh {
		return refuse("it stopped at step %q in shared mode, where evaluation needs the agent environment's state, which is lost; run it again without --resume", prev.Phase)
	}
	if missing := agentStepsUnfinished(prev, t); len(missing) > 0 {
		return refuse("the agent's part did not end (%s); its environment's state is lost; run it again without --resume", strings.Join(missing, ", "))
	}
	if open := leftoverIDs(prev); len(open) > 0 {
		if _, ok := p.(Reattacher); !ok {
			return refuse("environment(s) %s may still exist and provider %s cannot reattach them; close them (`compassctl env close --task %s`) and mark them closed, or run without --resume",
				strings.Join(open, ", "), p.Name(), t.ID)
		}
	}
	return lifecycle.StepEvaluationOpen, nil
}

// agentStepsUnfinished lists the agent steps the task needs whose end is not recorded.
func agentStepsUnfinished(prev *Record, t TaskRun) []string {
	needed := []lifecycle.StepName{lifecycle.StepRun}
	if t.Harness != nil {
		needed = append(needed, lifecycle.StepHarnessClose)
	}
	if len(t.Collect) > 0 {
		needed = append(needed, lifecycle.StepCollect)
	}
	if t.SaveArtifacts && len(t.Artifacts) > 0 {
		needed = append(needed, lifecycle.StepDownload)
	}
	var missing []string
	for _, name := range needed {
		if !stepEnded(prev, name) {
			missing = append(missing, string(name)+" not ended")
		}
	}
	return missing
}

// stepOK reports whether a step of that name ended ok.
func stepOK(rec *Record, name lifecycle.StepName) bool {
	return slices.ContainsFunc(rec.Steps, func(s StepRecord) bool { return s.Name == name && s.Status == StepOK })
}

// stepEnded reports whether a step of that name ran to its own end (ok, failed or timed
// out: the rollout's outcome is the evaluation's business).
func stepEnded(rec *Record, name lifecycle.StepName) bool {
	for _, s := range rec.Steps {
		if s.Name == name && (s.Status == StepOK || s.Status == StepFailed || s.Status == StepTimedOut) {
			return true
		}
	}
	return false
}

// leftover reports whether a resume must close e first: an environment still open, or
// an evaluation environment the interrupted run kept (retain), whose name the new
// evaluation environment needs.
func leftover(e EnvRecord) bool {
	return e.State == EnvOpen || e.Role == lifecycle.RoleEvaluation && e.State == EnvRetained
}

func leftoverIDs(rec *Record) []string {
	var ids []string
	for _, e := range rec.Environments {
		if leftover(e) {
			ids = append(ids, e.ID)
		}
	}
	return ids
}

// cutOpen is an open the interrupted run began and never saw end: its runner died
// inside the provider's Open, which may have left the environment's objects under the
// name the resume's open needs.
type cutOpen struct {
	Step  int // the open's index in the record's steps
	Role  lifecycle.Role
	Phase string
	Mode  policy.Mode
}

// cutOpens are the cut opens a resume must clean up after: only an open's last attempt
// counts, since a resume that ran the open again made the environment now under its
// name (kept with retain, or its own leftover, recorded as such).
func cutOpens(rec *Record) []cutOpen {
	last := map[lifecycle.StepName]int{}
	for i, s := range rec.Steps {
		last[s.Name] = i
	}
	var cut []cutOpen
	for i, s := range rec.Steps {
		if last[s.Name] != i || s.Status != StepRunning || s.Environment != "" {
			continue
		}
		switch s.Name {
		case lifecycle.StepOpen:
			cut = append(cut, cutOpen{i, lifecycle.RoleAgent, s.Phase, s.Mode})
		case lifecycle.StepEvaluationOpen:
			cut = append(cut, cutOpen{i, lifecycle.RoleEvaluation, s.Phase, s.Mode})
		}
	}
	return cut
}

// closeLeftovers closes the environments an interrupted run left, through the provider's
// Reattacher, and removes what its cut opens left, through its Remover (ResumeFrom made
// sure of each when it is needed). An agent environment is closed as its step 7 would
// have (kept with retain); an evaluation environment is removed whatever retain says,
// since the resume opens a new one in its place.
func (tr *taskRun) closeLeftovers(ctx context.Context, prev *Record) error {
	ra, _ := tr.r.Provider.(Reattacher)
	for _, e := range prev.Environments {
		if !leftover(e) || ra == nil {
			continue
		}
		env, err := ra.Reattach(ctx, tr.t.ID, e.Role)
		if err != nil && !errors.Is(err, ErrEnvironmentGone) {
			// It may still be running under whatever policy it had: it stays open in the
			// record, for a later resume or `close`, and nothing new starts beside it.
			return fmt.Errorf("controller: resume task %s: leftover environment %s: %w", tr.t.ID, e.ID, err)
		}
		if err != nil {
			// Gone already: the record says so instead of claiming it is open. A close cut
			// half-way may have left objects (the task network) under the name a new open
			// needs: a Remover removes them first.
			if rm, ok := tr.r.Provider.(Remover); ok {
				if err := tr.removeGone(ctx, rm, e.Role); err != nil {
					return fmt.Errorf("controller: resume task %s: leftover environment %s: %w", tr.t.ID, e.ID, err)
				}
			}
			tr.rec.update(func(r *Record) {
				for i := range r.Environments {
					if r.Environments[i].ID == e.ID && leftover(r.Environments[i]) {
						r.Environments[i].State = EnvClosed
						r.Environments[i].Reach = "not found on resume: " + err.Error()
					}
				}
			})
			continue
		}
		tr.mu.Lock()
		tr.envs[e.Role] = &envState{env: env, role: e.Role, phase: "reattached"}
		tr.mu.Unlock()
		if err := tr.closeEnv(ctx, e.Role, tr.t.Retain && e.Role != lifecycle.RoleEvaluation); err != nil {
			return err
		}
	}
	if rm, ok := tr.r.Provider.(Remover); ok {
		for _, c := range cutOpens(prev) {
			if err := tr.removeCutOpen(ctx, rm, c); err != nil {
				return err
			}
		}
	}
	return nil
}

// removeGone removes what is left of an environment that cannot be reattached.
func (tr *taskRun) removeGone(ctx context.Context, rm Remover, role lifecycle.Role) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tr.r.controlTimeout())
	defer cancel()
	_, err := rm.RemoveEnvironment(cctx, tr.t.ID, role)
	return err
}

// removeCutOpen removes what a cut open left, as a close step of its own (under the
// policy that open was putting in force, the most it can have had) and, when anything
// was there, an environment recorded closed. Never kept: it never became usable. Once
// that is done the open's step says it crashed instead of running: its runner died in
// it and it never ended (no end time is known). Until then it stays running, for a
// later resume to find.
func (tr *taskRun) removeCutOpen(ctx context.Context, rm Remover, c cutOpen) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tr.r.controlTimeout())
	defer cancel()
	name := lifecycle.StepClose
	if c.Role == lifecycle.RoleEvaluation {
		name = lifecycle.StepEvaluationEnd
	}
	idx := tr.beginStep(name, c.Role, "", c.Phase, c.Mode)
	id, err := rm.RemoveEnvironment(cctx, tr.t.ID, c.Role)
	if err != nil {
		err = fmt.Errorf("controller: resume task %s: remove what the cut open of its %s environment left: %w", tr.t.ID, c.Role, err)
		tr.endStep(idx, StepError, nil, err)
		return err
	}
	tr.rec.update(func(r *Record) {
		r.Steps[idx].Environment = id
		r.Environments = append(r.Environments, EnvRecord{ID: id, Role: c.Role, State: EnvClosed})
	})
	tr.endStep(idx, StepOK, nil, nil)
	tr.rec.update(func(r *Record) {
		s := &r.Steps[c.Step]
		s.Status = StepCrashed
		s.Error = fmt.Sprintf("its runner died during this open (killed, crashed, or abandoned by a second Ctrl-C), which never ended; the --resume started %s removed what it left (the %s step after it)",
			tr.started.UTC().Format(time.RFC3339), name)
	})
	return nil
}
