package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// stepError is a step that did not end ok. Failed and timed-out steps of the rollout are
// tolerated (the task goes on to evaluation); the others end the lifecycle.
type stepError struct {
	step   lifecycle.StepName
	status StepStatus
	err    error
}

func (e *stepError) Error() string { return e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

// tolerate swallows a step's own failure (non-zero exit, timeout) and passes on the
// errors that must stop the lifecycle (environment errors, cancellation, crashes).
func tolerate(err error) error {
	var se *stepError
	if errors.As(err, &se) && (se.status == StepFailed || se.status == StepTimedOut) {
		return nil
	}
	return err
}

// stepStatusOf tells a timeout of the step from a cancellation of the run.
func stepStatusOf(runCtx, stepCtx context.Context, otherwise StepStatus) StepStatus {
	switch {
	case runCtx.Err() != nil:
		return StepCancelled
	case errors.Is(stepCtx.Err(), context.DeadlineExceeded):
		return StepTimedOut
	}
	return otherwise
}

func (tr *taskRun) stepContext(ctx context.Context, name lifecycle.StepName) (context.Context, context.CancelFunc) {
	if d := tr.t.Timeouts[name]; d > 0 {
		return context.WithTimeout(ctx, d)
	}
	return context.WithCancel(ctx)
}

// beginStep appends a running step to the record and returns its index.
func (tr *taskRun) beginStep(name lifecycle.StepName, role lifecycle.Role, envID, phase string, mode policy.Mode) int {
	tr.mu.Lock()
	tr.current, tr.currentMode, tr.stepRole = name, mode, role
	tr.mu.Unlock()
	var idx int
	tr.rec.update(func(r *Record) {
		r.Phase = name
		r.Steps = append(r.Steps, StepRecord{Name: name, Environment: envID, Phase: phase, Mode: mode,
			Start: time.Now(), Status: StepRunning})
		idx = len(r.Steps) - 1
	})
	tr.report()
	return idx
}

// endStep closes a running step with its status, the last exit code and the error.
func (tr *taskRun) endStep(idx int, status StepStatus, exit *int, err error) {
	now := time.Now()
	tr.rec.update(func(r *Record) {
		s := &r.Steps[idx]
		s.End, s.Duration, s.Status, s.ExitCode = &now, now.Sub(s.Start), status, exit
		s.TimedOut = status == StepTimedOut
		if err != nil {
			s.Error = err.Error()
		}
	})
}

// skip records a row of the table whose condition does not hold.
func (tr *taskRun) skip(name lifecycle.StepName, role lifecycle.Role, reason string) {
	now := time.Now()
	s := StepRecord{Name: name, Start: now, End: &now, Status: StepSkipped, Reason: reason}
	if es := tr.envOf(role); es != nil {
		s.Environment, s.Phase, s.Mode = es.env.ID(), es.phase, es.policy.Mode
	}
	tr.rec.update(func(r *Record) { r.Steps = append(r.Steps, s) })
}

// step runs cmds one after the other in the role's environment, under the policy already
// in force there, and stops at the first command that does not exit 0. As for apply, the
// role's environment is open: a failed open ends the lifecycle.
func (tr *taskRun) step(ctx context.Context, name lifecycle.StepName, role lifecycle.Role, cmds []lifecycle.Command, env map[string]string) (err error) {
	es := tr.envOf(role)
	logRel := filepath.Join("logs", string(name)+".log")
	idx := tr.beginStep(name, role, es.env.ID(), es.phase, es.policy.Mode)
	tr.rec.update(func(r *Record) { r.Steps[idx].Log = logRel })
	// Only a command (Exec) panics here, before the step has ended.
	defer func() {
		if p := recover(); p != nil {
			tr.endStep(idx, StepCrashed, nil, fmt.Errorf("controller: step %s panicked: %v", name, p))
			panic(p)
		}
	}()
	sctx, cancel := tr.stepContext(ctx, name)
	defer cancel()
	stopPoll := tr.pollBlocked(sctx, es)
	defer stopPoll()
	logf, err := openLog(filepath.Join(tr.dir, logRel))
	if err != nil {
		tr.endStep(idx, StepError, nil, err)
		return &stepError{step: name, status: StepError, err: err}
	}
	defer logf.Close()

	var exit *int
	for _, cmd := range cmds {
		start := time.Now()
		res, xerr := es.env.Exec(sctx, cmd, ExecOptions{Env: env})
		cr := CommandRecord{Argv: cmd, Duration: time.Since(start)}
		writeCommandLog(logf, cmd, res, xerr)
		if xerr != nil {
			cr.Error = xerr.Error()
			tr.rec.update(func(r *Record) { r.Steps[idx].Commands = append(r.Steps[idx].Commands, cr) })
			status := stepStatusOf(ctx, sctx, StepError)
			if errors.Is(xerr, ErrCommandNotStopped) {
				status = StepError
			}
			serr := fmt.Errorf("controller: step %s: %s: %w", name, strings.Join(cmd, " "), xerr)
			tr.endStep(idx, status, nil, serr)
			return &stepError{step: name, status: status, err: serr}
		}
		code := res.ExitCode
		exit, cr.ExitCode = &code, &code
		tr.rec.update(func(r *Record) { r.Steps[idx].Commands = append(r.Steps[idx].Commands, cr) })
		if code != 0 {
			serr := fmt.Errorf("controller: step %s: %s exited %d", name, strings.Join(cmd, " "), code)
			tr.endStep(idx, StepFailed, exit, serr)
			return &stepError{step: name, status: StepFailed, err: serr}
		}
	}
	tr.endStep(idx, StepOK, exit, nil)
	return nil
}

func openLog(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("controller: create log directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("controller: open step log: %w", err)
	}
	return f, nil
}

// writeCommandLog appends a command's output to its step log: a header line, stdout,
// then stderr, each command's section easy to split and parse.
func writeCommandLog(f *os.File, cmd lifecycle.Command, res ExecResult, err error) {
	status := fmt.Sprintf("exit %d", res.ExitCode)
	if err != nil {
		status = "error: " + err.Error()
	}
	fmt.Fprintf(f, "### %s (%s)\n", strings.Join(cmd, " "), status)
	f.Write(res.Stdout)
	if len(res.Stdout) > 0 && res.Stdout[len(res.Stdout)-1] != '\n' {
		f.Write([]byte{'\n'})
	}
	if len(res.Stderr) > 0 {
		fmt.Fprintf(f, "### stderr\n%s", res.Stderr)
		if res.Stderr[len(res.Stderr)-1] != '\n' {
			f.Write([]byte{'\n'})
		}
	}
}

// pollBlocked refreshes the live blocked count while a step runs; the returned function
// stops the poller and waits for it.
func (tr *taskRun) pollBlocked(ctx context.Context, es *envState) func() {
	every := tr.r.BlockedPollInterval
	if every <= 0 {
		return func() {}
	}
	pctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-t.C:
				if sum, err := es.env.Blocked(pctx); err == nil {
					tr.mu.Lock()
					tr.blockedLive = sum.Total
					tr.mu.Unlock()
					tr.report()
				}
			}
		}
	}()
	return func() { cancel(); wg.Wait() }
}

// download is row 6's second half: each declared path is copied into
// <task>/artifacts/<path>. A path that does not resolve is recorded, not fatal.
func (tr *taskRun) download(ctx context.Context, role lifecycle.Role) error {
	es := tr.envOf(role)
	idx := tr.beginStep(lifecycle.StepDownload, role, es.env.ID(), es.phase, es.policy.Mode)
	sctx, cancel := tr.stepContext(ctx, lifecycle.StepDownload)
	defer cancel()
	var failed []string
	for _, p := range tr.t.Artifacts {
		rel := filepath.Join("artifacts", filepath.Clean("/"+p))
		dst := filepath.Join(tr.dir, filepath.Dir(rel))
		ar := ArtifactRecord{Path: p}
		// A step cut short (timeout, cancellation) tries no more paths, but records each
		// as not saved: the step must not end ok with paths it never copied.
		err := sctx.Err()
		if err != nil {
			err = fmt.Errorf("not tried: %w", err)
		} else if err = os.MkdirAll(dst, 0o755); err == nil {
			err = es.env.Download(sctx, p, dst)
		}
		if err != nil {
			ar.Error = err.Error()
			failed = append(failed, p)
		} else {
			ar.Saved, ar.Local = true, rel
		}
		tr.rec.update(func(r *Record) { r.Artifacts = append(r.Artifacts, ar) })
	}
	if len(failed) == 0 {
		tr.endStep(idx, StepOK, nil, nil)
		return nil
	}
	status := stepStatusOf(ctx, sctx, StepFailed)
	err := fmt.Errorf("controller: download: not saved: %s", strings.Join(failed, ", "))
	tr.endStep(idx, status, nil, err)
	return &stepError{step: lifecycle.StepDownload, status: status, err: err}
}

// upload hands the saved artifacts to the fresh evaluation environment, at the paths the
// agent environment had them, before the evaluation policy is applied.
func (tr *taskRun) upload(ctx context.Context, role lifecycle.Role) error {
	es := tr.envOf(role)
	saved := tr.rec.snapshot().Artifacts
	var files []ArtifactRecord
	for _, a := range saved {
		if a.Saved {
			files = append(files, a)
		}
	}
	up, ok := es.env.(Uploader)
	switch {
	case len(files) == 0:
		tr.skip(lifecycle.StepUpload, role, "no saved artifacts")
		return nil
	case !ok:
		tr.skip(lifecycle.StepUpload, role, "the provider cannot copy files into an environment")
		return nil
	}
	idx := tr.beginStep(lifecycle.StepUpload, role, es.env.ID(), es.phase, es.policy.Mode)
	sctx, cancel := tr.stepContext(ctx, lifecycle.StepUpload)
	defer cancel()
	for _, a := range files {
		if err := up.Upload(sctx, filepath.Join(tr.dir, a.Local), filepath.Dir(a.Path)); err != nil {
			status := stepStatusOf(ctx, sctx, StepError)
			err = fmt.Errorf("controller: upload %s: %w", a.Path, err)
			tr.endStep(idx, status, nil, err)
			return &stepError{step: lifecycle.StepUpload, status: status, err: err}
		}
	}
	tr.endStep(idx, StepOK, nil, nil)
	return nil
}
