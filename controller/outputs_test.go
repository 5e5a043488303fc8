package controller_test

import (
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

func TestPrepareOutputs(t *testing.T) {
	out := t.TempDir()
	fake := controllertest.New()
	r := &controller.Runner{Provider: fake, OutDir: out}
	done := controller.TaskRun{ID: "done", Mode: policy.EvaluationShared, Image: "i",
		Policies: controller.PhasePolicies{Baseline: policy.Public, Run: policy.NoNetwork, Evaluation: policy.NoNetwork},
		Run:      []lifecycle.Command{{"x"}}}
	if _, err := r.RunTask(t.Context(), done, nil); err != nil {
		t.Fatal(err)
	}
	fresh := done
	fresh.ID = "new"

	run, prevs, skipped, err := controller.PrepareOutputs(out, []controller.TaskRun{done, fresh}, true, fake)
	if err != nil || len(run) != 1 || run[0].ID != "new" || len(prevs) != 0 || !slices.Equal(skipped, []string{"done"}) {
		t.Errorf("resume: run %v prevs %v skipped %v err %v", run, prevs, skipped, err)
	}
	changed := done
	changed.Run = []lifecycle.Command{{"y"}}
	if _, _, _, err := controller.PrepareOutputs(out, []controller.TaskRun{changed}, true, fake); err != nil {
		t.Errorf("a finished task is skipped before its definition is compared: %v", err)
	}
	// Without --resume the old record is cleared and the task runs again.
	run, _, _, err = controller.PrepareOutputs(out, []controller.TaskRun{done}, false, fake)
	if err != nil || len(run) != 1 {
		t.Fatalf("fresh run: %v %v", run, err)
	}
	if _, err := os.Stat(filepath.Join(out, "done", controller.RecordFile)); !os.IsNotExist(err) {
		t.Errorf("old record not cleared: %v", err)
	}
}

// TestPrepareOutputsResume: with --resume, a record to pick up from is handed to the
// runner; every record that cannot be read or resumed is refused, all of them named in
// one error, and nothing is run or cleared.
func TestPrepareOutputsResume(t *testing.T) {
	task := controller.TaskRun{ID: "t1", Mode: policy.EvaluationShared, Image: "i",
		Policies: controller.PhasePolicies{Baseline: policy.Public, Run: policy.NoNetwork, Evaluation: policy.NoNetwork},
		Run:      []lifecycle.Command{{"x"}}}
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
	run, prevs, _, err := controller.PrepareOutputs(out, []controller.TaskRun{task}, true, controllertest.New())
	if err != nil || len(run) != 1 || prevs["t1"] == nil || prevs["t1"].TaskDigest != task.Digest() {
		t.Errorf("interrupted task: run %v prevs %v err %v; want it run from its record", run, prevs, err)
	}

	out = t.TempDir()
	write(t, out, "t1", "not json")
	write(t, out, "t2", `{"version": 1, "task_id": "t2", "status": "running"}`)
	run, prevs, _, err = controller.PrepareOutputs(out, []controller.TaskRun{task, other}, true, controllertest.New())
	if err == nil || run != nil || prevs != nil {
		t.Fatalf("unreadable and undigested records: run %v prevs %v err %v; want both refused", run, prevs, err)
	}
	for _, want := range []string{"read record " + filepath.Join(out, "t1", controller.RecordFile), "cannot resume task t2: the record has no task_digest"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
