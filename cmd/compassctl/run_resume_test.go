package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/controllertest"
	"github.com/compass-egress/compass-egress/policy"
)

// TestRunResumeOutcomes: --resume leaves a finished task alone and exits 0 with nothing
// to run; a record it may not resume from is refused as bad input (exit 2, docs/run.md)
// and left as it was. Neither reaches Docker (DOCKER_HOST names no engine).
func TestRunResumeOutcomes(t *testing.T) {
	state := noEngine(t)
	task := writeTemp(t, "task.yaml", "task_id: t1\nimage: i\nrun: [x]\n")
	finished := t.TempDir()
	r := &controller.Runner{Provider: controllertest.New(), OutDir: finished}
	if _, err := r.RunTask(t.Context(), controller.TaskRun{ID: "t1", Mode: policy.EvaluationShared, Image: "i",
		Policies: controller.PhasePolicies{Baseline: policy.Public, Run: policy.NoNetwork, Evaluation: policy.NoNetwork},
		Run:      []policy.Command{{"x"}}}, nil); err != nil {
		t.Fatal(err)
	}
	undigested := t.TempDir()
	if err := os.MkdirAll(filepath.Join(undigested, "t1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(undigested, "t1", controller.RecordFile), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, out  string
		code       int
		wantStdout string
	}{
		{"finished", finished, 0, "t1: already finished, left alone (--resume)\n"},
		{"not resumable", undigested, 2, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			record := filepath.Join(tc.out, "t1", controller.RecordFile)
			before, err := os.ReadFile(record)
			if err != nil {
				t.Fatal(err)
			}
			code, stdout, stderr := runCaptured(t, "run", task, "--resume", "--out", tc.out, "--state-dir", state, "--progress", "plain")
			if code != tc.code || stdout != tc.wantStdout {
				t.Errorf("exit %d stdout %q stderr %q; want exit %d and %q", code, stdout, stderr, tc.code, tc.wantStdout)
			}
			if tc.code == 2 && !strings.Contains(stderr, "t1") {
				t.Errorf("refusal %q does not name the task", stderr)
			}
			if after, err := os.ReadFile(record); err != nil || string(after) != string(before) {
				t.Errorf("record changed: %v", err)
			}
		})
	}
}

// TestPrepareOutputsResume: with --resume, a record to pick up from is handed to the
// runner; every record that cannot be read or resumed is refused, all of them named in
// one error, and nothing is run or cleared.
func TestPrepareOutputsResume(t *testing.T) {
	task := controller.TaskRun{ID: "t1", Mode: policy.EvaluationShared, Image: "i",
		Policies: controller.PhasePolicies{Baseline: policy.Public, Run: policy.NoNetwork, Evaluation: policy.NoNetwork},
		Run:      []policy.Command{{"x"}}}
	other := task
	other.ID = "t2"
	write := func(t *testing.T, out, id, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(out, id), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, id, controller.RecordFile), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	interrupted := `{"version": 1, "task_id": "t1", "task_digest": "` + task.Digest() + `", "status": "running"}`

	out := t.TempDir()
	write(t, out, "t1", interrupted)
	run, prevs, _, err := prepareOutputs(out, []controller.TaskRun{task}, true, controllertest.New())
	if err != nil || len(run) != 1 || prevs["t1"] == nil || prevs["t1"].TaskDigest != task.Digest() {
		t.Errorf("interrupted task: run %v prevs %v err %v; want it run from its record", run, prevs, err)
	}

	out = t.TempDir()
	write(t, out, "t1", "not json")
	write(t, out, "t2", `{"version": 1, "task_id": "t2", "status": "running"}`)
	run, prevs, _, err = prepareOutputs(out, []controller.TaskRun{task, other}, true, controllertest.New())
	if err == nil || run != nil || prevs != nil {
		t.Fatalf("unreadable and undigested records: run %v prevs %v err %v; want both refused", run, prevs, err)
	}
	for _, want := range []string{"read record " + filepath.Join(out, "t1", controller.RecordFile), "cannot resume task t2: the record has no task_digest"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
