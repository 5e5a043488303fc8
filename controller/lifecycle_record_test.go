package controller_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/controllertest"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// TestRecordMidRun reads the record on disk while a step runs, as an operator (or a
// later --resume, should the runner die there) would find it: the task is running, not
// ended, its phase is the step in progress, and that step is running. A resumed task
// shows running too, not the interrupted run's status.
func TestRecordMidRun(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mode   policy.EvaluationMode
		resume bool
		step   lifecycle.StepName // the step that reads the record
	}{
		{"shared, during the rollout", policy.EvaluationShared, false, lifecycle.StepRun},
		{"fresh, during evaluate", policy.EvaluationFresh, false, lifecycle.StepEvaluate},
		{"resumed, during evaluate", policy.EvaluationFresh, true, lifecycle.StepEvaluate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := controllertest.New()
			r := newRunner(t, p)
			tr := task(t, tc.mode)
			switch tc.step {
			case lifecycle.StepRun:
				tr.Run = []lifecycle.Command{{"cancel"}}
			case lifecycle.StepEvaluate:
				tr.Evaluate = []lifecycle.Command{{"cancel"}}
			}
			var prev *controller.Record
			if tc.resume {
				prev, _ = r.RunTask(ctrlCAtEvaluationOpen(t, p), tr, nil)
				if prev.Status != controller.StatusCancelled {
					t.Fatalf("interrupted run: %s", prev.Status)
				}
				p.OpenErr = nil
			}
			var mid *controller.Record
			p.Cancel = func() { mid = readRecord(t, r, tr.ID) }
			if _, err := r.RunTask(context.Background(), tr, prev); err != nil {
				t.Fatal(err)
			}
			if mid == nil {
				t.Fatal("the step never ran")
			}
			last := mid.Steps[len(mid.Steps)-1]
			if mid.Status != controller.StatusRunning || mid.Ended != nil || mid.Error != "" || mid.Phase != tc.step ||
				last.Name != tc.step || last.Status != controller.StepRunning {
				t.Errorf("record during %s: status %s, ended %v, error %q, phase %s, last step %s:%s",
					tc.step, mid.Status, mid.Ended, mid.Error, mid.Phase, last.Name, last.Status)
			}
		})
	}
}

// TestStaleNotice: a task directory that holds the statement of an earlier run loses it
// when this run injects none, so the directory and the record's notice agree.
func TestStaleNotice(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*controller.TaskRun)
	}{
		{"public run policy", func(tr *controller.TaskRun) { tr.Notice = "" }},
		{"inject_network_restriction_notice false", func(tr *controller.TaskRun) { tr.InjectNotice = false }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRunner(t, controllertest.New())
			tr := task(t, policy.EvaluationShared)
			tc.change(&tr)
			path := filepath.Join(r.OutDir, tr.ID, controller.NoticeFile)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(notice), 0o644); err != nil {
				t.Fatal(err)
			}
			rec, err := r.RunTask(context.Background(), tr, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) || rec.Notice.Injected {
				t.Errorf("notice file: %v, record %+v; want no file, not injected", err, rec.Notice)
			}
		})
	}
}

// blindProvider is the fake provider whose sidecars cannot be asked for their blocked
// attempts.
type blindProvider struct{ *controllertest.Provider }

type blindEnv struct{ controller.Environment }

func (p blindProvider) Open(ctx context.Context, spec controller.EnvSpec) (controller.Environment, error) {
	e, err := p.Provider.Open(ctx, spec)
	if err != nil {
		return nil, err
	}
	return blindEnv{e}, nil
}

func (blindEnv) Blocked(context.Context) (adminapi.BlockedSummary, error) {
	return adminapi.BlockedSummary{}, errors.New("sidecar unreachable")
}

// TestBlockedReadFails: a phase whose summary could not be read says so in the record,
// instead of claiming nothing was blocked; a phase that the switch's own summary ended
// has that summary, and no error.
func TestBlockedReadFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		report bool // switches report the ended generation's summary
		want   []string
	}{
		{"switches report nothing", false, []string{"baseline sidecar unreachable", "run sidecar unreachable",
			"evaluation sidecar unreachable", "baseline sidecar unreachable"}},
		{"switches report the ended phase", true, []string{"baseline ", "run ", "evaluation ", "baseline sidecar unreachable"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := blindProvider{controllertest.New()}
			p.ReportPrevious = tc.report
			rec, err := newRunner(t, p).RunTask(context.Background(), task(t, policy.EvaluationShared), nil)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, b := range rec.Blocked {
				got = append(got, b.Phase+" "+b.Error)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("blocked\n got  %q\n want %q", got, tc.want)
			}
		})
	}
}

// progressLog keeps every update the runner sends; onUpdate, when set, sees each.
type progressLog struct {
	mu       sync.Mutex
	updates  []controller.ProgressUpdate
	onUpdate func(controller.ProgressUpdate)
}

func (p *progressLog) Update(u controller.ProgressUpdate) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.updates = append(p.updates, u)
	if p.onUpdate != nil {
		p.onUpdate(u)
	}
}

// TestProgressBlockedCount: the blocked count the progress display shows is of every
// phase so far, the one in force as last polled included: it never goes down, never
// counts a phase twice, and ends at the record's total.
func TestProgressBlockedCount(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mode  policy.EvaluationMode
		run   []lifecycle.Command
		polls bool // the run is cancelled once the poller showed the rollout's 3 attempts
		total uint64
	}{
		{"shared", policy.EvaluationShared, []lifecycle.Command{{"blocked", "3"}}, false, 4},
		{"fresh", policy.EvaluationFresh, []lifecycle.Command{{"blocked", "3"}}, false, 4},
		{"polled during the rollout", policy.EvaluationShared, []lifecycle.Command{{"blocked", "3"}, {"hang"}}, true, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pl := &progressLog{}
			if tc.polls {
				pl.onUpdate = func(u controller.ProgressUpdate) {
					if u.Step == lifecycle.StepRun && u.Blocked == 3 {
						cancel()
					}
				}
			}
			r := newRunner(t, controllertest.New())
			r.Progress, r.BlockedPollInterval = pl, time.Millisecond
			tr := task(t, tc.mode)
			tr.Run = tc.run
			if tc.polls {
				// Bounds the test should the live count never show: the total is then wrong.
				tr.Timeouts = map[lifecycle.StepName]time.Duration{lifecycle.StepRun: 10 * time.Second}
			}
			tr.Evaluate = []lifecycle.Command{{"blocked", "1"}}
			rec, _ := r.RunTask(ctx, tr, nil)
			if rec.BlockedTotal() != tc.total {
				t.Fatalf("record's total %d, want %d", rec.BlockedTotal(), tc.total)
			}
			var seen []uint64
			for _, u := range pl.updates {
				if n := len(seen); n > 0 && u.Blocked < seen[n-1] || u.Blocked > tc.total {
					t.Errorf("blocked counts %v, then %d: want them rising to %d", seen, u.Blocked, tc.total)
				}
				seen = append(seen, u.Blocked)
			}
			if last := pl.updates[len(pl.updates)-1]; !last.Done || last.Blocked != tc.total {
				t.Errorf("last update %+v, want done with %d blocked", last, tc.total)
			}
		})
	}
}

// TestStepLog: a step's log has each command's header with its exit status (or error),
// its stdout, and its stderr under a header of its own.
func TestStepLog(t *testing.T) {
	r := newRunner(t, controllertest.New())
	tr := task(t, policy.EvaluationShared)
	tr.Prepare = []lifecycle.Command{{"prep"}, {"stdout", "no", "newline"}, {"stderr", "no", "newline"}, {"hang"}}
	tr.Timeouts = map[lifecycle.StepName]time.Duration{lifecycle.StepPrepare: 20 * time.Millisecond}
	rec, _ := r.RunTask(context.Background(), tr, nil)
	b, err := os.ReadFile(filepath.Join(r.OutDir, tr.ID, "logs", "prepare.log"))
	if err != nil {
		t.Fatal(err)
	}
	want := "### prep (exit 0)\n{\"cmd\":\"prep\"}\n" +
		"### stdout no newline (exit 0)\nno newline\n" +
		"### stderr no newline (exit 0)\n### stderr\nno newline\n" +
		"### hang (error: context deadline exceeded)\n"
	if string(b) != want {
		t.Errorf("log\n got  %q\n want %q", b, want)
	}
	i := slices.IndexFunc(rec.Steps, func(s controller.StepRecord) bool { return s.Name == lifecycle.StepPrepare })
	var codes []string
	for _, c := range rec.Steps[i].Commands {
		code := "-"
		if c.ExitCode != nil {
			code = string(rune('0' + *c.ExitCode))
		}
		codes = append(codes, code+" "+c.Error)
	}
	if want := []string{"0 ", "0 ", "0 ", "- context deadline exceeded"}; !slices.Equal(codes, want) {
		t.Errorf("commands' exit codes and errors %q, want %q", codes, want)
	}
}

// TestCancelledWhateverTheError: a Ctrl-C, whether a provider reports it as an error of
// its own (not wrapping context.Canceled) or it comes between two steps, makes the task
// cancelled, not failed.
func TestCancelledWhateverTheError(t *testing.T) {
	aborted := errors.New("engine: request aborted")
	for _, tc := range []struct {
		name  string
		mode  policy.EvaluationMode
		setup func(tr *controller.TaskRun, p *controllertest.Provider, cancel func())
		steps []string
		last  string // the last event: nothing runs or switches after the Ctrl-C
	}{
		{"open", policy.EvaluationShared, func(_ *controller.TaskRun, p *controllertest.Provider, cancel func()) {
			p.OpenErr = func(lifecycle.Role) error { cancel(); return aborted }
		}, []string{"open:cancelled"}, "agent open failed"},
		{"switch to run", policy.EvaluationShared, func(_ *controller.TaskRun, p *controllertest.Provider, cancel func()) {
			p.ApplyErr = func(phase string) error {
				if phase == string(policy.PhaseRun) {
					cancel()
					return aborted
				}
				return nil
			}
		}, []string{"open:ok", "prepare:ok", "harness_start:ok", "close:ok"}, "agent close retain=false mode=no-network"},
		{"as a step ends, before the switch", policy.EvaluationShared, func(tr *controller.TaskRun, p *controllertest.Provider, cancel func()) {
			tr.Harness.Start = []lifecycle.Command{{"cancel"}}
			p.Cancel = cancel
		}, []string{"open:ok", "prepare:ok", "harness_start:ok", "close:ok"}, "agent close retain=false mode=no-network"},
		{"download", policy.EvaluationShared, func(_ *controller.TaskRun, p *controllertest.Provider, cancel func()) {
			p.DownloadErr = func() error { cancel(); return aborted }
		}, []string{"open:ok", "prepare:ok", "harness_start:ok", "run:ok", "harness_close:ok", "collect:ok",
			"download:cancelled", "close:ok"}, "agent close retain=false mode=allowlist"},
		{"upload", policy.EvaluationFresh, func(_ *controller.TaskRun, p *controllertest.Provider, cancel func()) {
			p.UploadErr = func() error { cancel(); return aborted }
		}, []string{"open:ok", "prepare:ok", "harness_start:ok", "run:ok", "harness_close:ok", "collect:ok", "download:ok",
			"close:ok", "evaluation_open:ok", "upload_artifacts:cancelled", "evaluation_close:ok"},
			"evaluation close retain=false mode=no-network"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			p := controllertest.New()
			tr := task(t, tc.mode)
			tc.setup(&tr, p, cancel)
			r := newRunner(t, p)
			rec, err := r.RunTask(ctx, tr, nil)
			if err == nil || rec.Status != controller.StatusCancelled || !slices.Equal(stepsOf(rec), tc.steps) {
				t.Errorf("RunTask: %v, status %s, steps %v; want cancelled, steps %v", err, rec.Status, stepsOf(rec), tc.steps)
			}
			if ev := p.Events(); ev[len(ev)-1] != tc.last || slices.Contains(ev, "agent apply evaluation denylist failed") {
				t.Errorf("events:\n%s\nwant the last %q, no switch after the Ctrl-C", strings.Join(ev, "\n"), tc.last)
			}
			// Each phase's blocked summary is read, the cancelled run's context notwithstanding.
			for _, b := range rec.Blocked {
				if b.Error != "" {
					t.Errorf("blocked summary %+v not read", b)
				}
			}
		})
	}
}

// TestArtifactPathsStayInside: an artifact path, relative or climbing out with "..", is
// saved under the task's artifacts directory and nowhere else on the host.
func TestArtifactPathsStayInside(t *testing.T) {
	r := newRunner(t, controllertest.New())
	tr := task(t, policy.EvaluationShared)
	tr.Artifacts = []string{"/out/result.tar", "../../escape.tar", "rel/../../up.tar"}
	rec, err := r.RunTask(context.Background(), tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range rec.Artifacts {
		got = append(got, a.Local)
	}
	want := []string{"artifacts/out/result.tar", "artifacts/escape.tar", "artifacts/up.tar"}
	if !slices.Equal(got, want) {
		t.Errorf("saved at %v, want %v", got, want)
	}
	for _, rel := range want {
		if fi, err := os.Stat(filepath.Join(r.OutDir, tr.ID, rel)); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s: %v, want the saved file there", rel, err)
		}
	}
	for _, outside := range []string{"escape.tar", "up.tar", "../escape.tar", "../up.tar"} {
		if _, err := os.Stat(filepath.Join(r.OutDir, outside)); err == nil {
			t.Errorf("%s written outside the task's directory", outside)
		}
	}
}

// TestNoticeWriteFails: a restriction statement that cannot be written stops the task
// before anything opens: the rollout would run without the statement the record promises.
func TestNoticeWriteFails(t *testing.T) {
	p := controllertest.New()
	r := newRunner(t, p)
	tr := task(t, policy.EvaluationShared)
	// A directory in the statement's place.
	if err := os.MkdirAll(filepath.Join(r.OutDir, tr.ID, controller.NoticeFile), 0o755); err != nil {
		t.Fatal(err)
	}
	rec, err := r.RunTask(context.Background(), tr, nil)
	if err == nil || !strings.Contains(err.Error(), "write notice") || rec.Status != controller.StatusFailed {
		t.Errorf("RunTask: %v, status %s; want it failed on the notice", err, rec.Status)
	}
	if ev := p.Events(); len(ev) != 0 {
		t.Errorf("events %v, want none", ev)
	}
}

// TestProgressModes: the progress display shows each step, and each switch, with the
// mode in force in its environment at that moment: a switch shows the outgoing mode
// until the new one is in force, then the new one; a failed switch shows no-network.
func TestProgressModes(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mode     policy.EvaluationMode
		applyErr bool // the switch to run fails
		want     []string
	}{
		{"shared", policy.EvaluationShared, false, []string{"open public", "prepare public", "harness_start public", "switch:run public",
			"switch:run allowlist", "run allowlist", "harness_close allowlist", "collect allowlist", "download allowlist",
			"switch:evaluation allowlist", "switch:evaluation denylist", "evaluate denylist", "switch:baseline denylist",
			"switch:baseline public", "close public", "done: succeeded -"}},
		{"fresh", policy.EvaluationFresh, false, []string{"open public", "prepare public", "harness_start public",
			"switch:run public", "switch:run allowlist", "run allowlist", "harness_close allowlist", "collect allowlist",
			"download allowlist", "close allowlist", "evaluation_open no-network", "upload_artifacts no-network",
			"switch:evaluation no-network", "switch:evaluation denylist", "evaluate denylist",
			"switch:evaluation_baseline denylist", "switch:evaluation_baseline no-network", "evaluation_close no-network",
			"done: succeeded -"}},
		{"failed switch", policy.EvaluationShared, true, []string{"open public", "prepare public", "harness_start public", "switch:run public",
			"switch:run no-network", "close no-network", "done: failed -"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl := &progressLog{}
			p := controllertest.New()
			if tc.applyErr {
				p.ApplyErr = func(phase string) error {
					if phase == string(policy.PhaseRun) {
						return errors.New("sidecar refused")
					}
					return nil
				}
			}
			r := newRunner(t, p)
			r.Progress = pl
			tr := task(t, tc.mode)
			_, _ = r.RunTask(context.Background(), tr, nil)
			var got []string
			for _, u := range pl.updates {
				step := string(u.Step)
				if u.Done {
					step = "done: " + string(u.Status)
				}
				mode := string(u.Mode)
				if mode == "" {
					mode = "-"
				}
				if s := step + " " + mode; len(got) == 0 || got[len(got)-1] != s {
					got = append(got, s)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("progress\n got  %v\n want %v", got, tc.want)
			}
		})
	}
}

// TestRecordCannotBeWritten: a task whose record cannot be written at all does not run:
// nothing would say what ran in it.
func TestRecordCannotBeWritten(t *testing.T) {
	p := controllertest.New()
	r := newRunner(t, p)
	tr := task(t, policy.EvaluationShared)
	// A directory, not empty, in the record's place.
	if err := os.MkdirAll(filepath.Join(r.OutDir, tr.ID, controller.RecordFile, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunTask(context.Background(), tr, nil); err == nil || !strings.Contains(err.Error(), "write record") {
		t.Errorf("RunTask: %v, want the record's write failure", err)
	}
	if ev := p.Events(); len(ev) != 0 {
		t.Errorf("events %v, want none", ev)
	}
}
