package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/controllertest"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
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
		Run:      []lifecycle.Command{{"x"}}}, nil); err != nil {
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
