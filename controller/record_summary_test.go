package controller_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy"
)

// TestWriteSummary: one row per task with its mode, status, step counts (in the order
// each status first appears), blocked attempts per phase, and where its record is; a
// task with no record says why; then every task's error and how to reach what it kept.
func TestWriteSummary(t *testing.T) {
	ok, failed, skipped := controller.StepOK, controller.StepFailed, controller.StepSkipped
	rec := &controller.Record{
		Task: "a", EvaluationMode: policy.EvaluationShared, Status: controller.StatusFailed,
		Steps: []controller.StepRecord{{Status: ok}, {Status: skipped}, {Status: ok}, {Status: failed}, {Status: ok}},
		Blocked: []controller.PhaseBlocked{
			{Phase: "baseline"}, {Phase: "run", Summary: adminapi.BlockedSummary{Total: 5}},
			{Phase: ""}, // no phase: not a phase of the table
			{Phase: "evaluation", Summary: adminapi.BlockedSummary{Total: 1}},
		},
		Environments: []controller.EnvRecord{
			{ID: "a", State: controller.EnvRetained, Reach: "docker exec -it a sh"},
			{ID: "a-eval", State: controller.EnvClosed, Reach: "not found on resume"},
		},
	}
	empty := &controller.Record{Task: "b", EvaluationMode: policy.EvaluationFresh, Status: controller.StatusRefused}
	var out bytes.Buffer
	controller.WriteSummary(&out, "out", []controller.Outcome{
		{Task: "a", Record: rec, Err: errors.New("controller: task a failed: steps not ok")},
		{Task: "b", Record: empty, Err: errors.New("controller: task b refused")},
		{Task: "c", Err: errors.New("controller: create task directory: denied")},
	})
	var got []string
	for _, l := range strings.Split(strings.TrimRight(out.String(), "\n"), "\n") {
		got = append(got, strings.Join(strings.Fields(l), " "))
	}
	want := []string{
		"TASK MODE STATUS STEPS BLOCKED BY PHASE RECORD",
		"a shared failed 3 ok, 1 skipped, 1 failed baseline 0, run 5, evaluation 1 out/a/run_info.json",
		"b fresh refused - - out/b/run_info.json",
		"c - not run - - controller: create task directory: denied",
		"a: controller: task a failed: steps not ok",
		"a: retained a: docker exec -it a sh",
		"b: controller: task b refused",
		"c: controller: create task directory: denied",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("summary\n got  %q\n want %q", got, want)
	}
}
