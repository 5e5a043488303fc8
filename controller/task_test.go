package controller_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

func planOf(t *testing.T, doc string) *policy.Plan {
	t.Helper()
	return planAt(t, filepath.Join(t.TempDir(), "task.yaml"), doc)
}

// planAt plans the one task doc holds, written to file (whose name is in the plan),
// with the runner's checks.
func planAt(t *testing.T, file, doc string) *policy.Plan {
	t.Helper()
	p, err := planChecked(file, doc)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func planChecked(file, doc string) (*policy.Plan, error) {
	if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
		return nil, err
	}
	tasks, err := policy.LoadTasks(file)
	if err != nil {
		return nil, err
	}
	pl := policy.Planner{Check: controller.CheckTask}
	return pl.Plan(tasks[0])
}

func TestNewTaskRunExample(t *testing.T) {
	p := planOf(t, `task_id: swe-1
evaluation_mode: fresh
image: agent:1
evaluation_image: grader:1
run_network_policy: {network_mode: allowlist, allowed_hosts: ["model.test:443"]}
prepare: ["fetch http://packages.test/tool.tar"]
harness: {start: ["hs"], close: [["hc", "two words"]]}
run: ["agent --task /task"]
collect: ["pack /out/result.tar /work"]
artifacts: ["/out/result.tar"]
evaluate: ["grade /out/result.tar"]
retain: true
timeouts: {prepare: 10m, run: 90, evaluate: 1.5s}
`)
	tr, err := controller.NewTaskRun(p)
	if err != nil {
		t.Fatal(err)
	}
	if tr.ID != "swe-1" || tr.Mode != policy.EvaluationFresh || tr.Image != "agent:1" || tr.EvaluationImage != "grader:1" || !tr.Retain {
		t.Errorf("header %+v", tr)
	}
	if !tr.SaveArtifacts {
		t.Error("save_artifacts should default to true with artifacts declared")
	}
	if tr.Policies.Run.Mode != policy.ModeAllowlist || tr.Policies.EvaluationBaseline.Mode != policy.ModePublic {
		t.Errorf("policies %+v", tr.Policies)
	}
	if !tr.InjectNotice || !strings.Contains(tr.Notice, "- model.test:443") {
		t.Errorf("notice %q", tr.Notice)
	}
	if !slices.Equal(tr.Prepare[0], lifecycle.Command{"fetch", "http://packages.test/tool.tar"}) ||
		!slices.Equal(tr.Harness.Close[0], lifecycle.Command{"hc", "two words"}) || len(tr.Harness.Start) != 1 {
		t.Errorf("commands %+v %+v", tr.Prepare, tr.Harness)
	}
	want := map[lifecycle.StepName]time.Duration{"prepare": 10 * time.Minute, "run": 90 * time.Second, "evaluate": 1500 * time.Millisecond}
	for k, v := range want {
		if tr.Timeouts[k] != v {
			t.Errorf("timeout %s = %s, want %s", k, tr.Timeouts[k], v)
		}
	}
	if !bytes.Contains(tr.Plan, []byte(`"run_network_mode":"allowlist"`)) {
		t.Errorf("plan %s", tr.Plan)
	}
}

// TestNewTaskRunDigest checks that the task a plan becomes has a digest in both modes,
// and one that changes with the definition: --resume compares records by it.
func TestNewTaskRunDigest(t *testing.T) {
	tests := []struct{ mode, extra string }{
		{"shared", ""},
		{"fresh", "evaluation_image: grader:1\n"},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "task.yaml") // one file: its name is in the plan
			digest := func(run string) string {
				doc := "task_id: d-1\nevaluation_mode: " + tc.mode + "\nimage: agent:1\n" + tc.extra + "run: [" + run + "]\n"
				tr, err := controller.NewTaskRun(planAt(t, file, doc))
				if err != nil {
					t.Fatal(err)
				}
				return tr.Digest()
			}
			if a, b := digest("agent"), digest("other"); a == "" || a == b || a != digest("agent") {
				t.Errorf("digests %q and %q: want two different, non-empty, repeatable ones", a, b)
			}
		})
	}
}

func TestNewTaskRunDefaultsAndPolicies(t *testing.T) {
	const policies = "baseline_network_policy: public\n" +
		"run_network_policy: {network_mode: allowlist, allowed_hosts: [model.test]}\n" +
		"evaluation_network_policy: {network_mode: allowlist, allowed_hosts: [judge.test]}\n"
	tests := []struct {
		name, doc            string
		retain, save         bool
		evaluationBaseline   string
		baseline, run, evalu string
	}{
		{"shared, no artifacts", "task_id: a\nimage: i\nrun: [x]\ntimeouts: {open: 90, run: 1.5}\n" + policies, false, false, "",
			`"public"`, `{"network_mode":"allowlist","allowed_hosts":["model.test"]}`, `{"network_mode":"allowlist","allowed_hosts":["judge.test"]}`},
		{"fresh, artifacts, retained", "task_id: a\nimage: i\nrun: [x]\nevaluation_mode: fresh\nevaluation_image: g\nartifacts: [/out/r]\nretain: true\n" +
			policies + "evaluation_baseline_network_policy: no-network\n", true, true, `"no-network"`,
			`"public"`, `{"network_mode":"allowlist","allowed_hosts":["model.test"]}`, `{"network_mode":"allowlist","allowed_hosts":["judge.test"]}`},
		{"artifacts not saved", "task_id: a\nimage: i\nrun: [x]\nartifacts: [/out/r]\nsave_artifacts: false\n" + policies, false, false, "",
			`"public"`, `{"network_mode":"allowlist","allowed_hosts":["model.test"]}`, `{"network_mode":"allowlist","allowed_hosts":["judge.test"]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := planOf(t, tc.doc)
			p.ProxyStartTimeout = 45 * time.Second // an env-params setting
			tr, err := controller.NewTaskRun(p)
			if err != nil {
				t.Fatal(err)
			}
			if tr.Retain != tc.retain || tr.SaveArtifacts != tc.save {
				t.Errorf("retain %t save_artifacts %t; want %t %t", tr.Retain, tr.SaveArtifacts, tc.retain, tc.save)
			}
			if tc.name == "shared, no artifacts" {
				// A number of seconds keeps its fraction; open is a step a timeout bounds.
				if tr.Timeouts[lifecycle.StepRun] != 1500*time.Millisecond || tr.Timeouts[lifecycle.StepOpen] != 90*time.Second || tr.ProxyStartTimeout != 45*time.Second {
					t.Errorf("timeouts %v, proxy start timeout %s; want run 1.5s, open 90s, 45s", tr.Timeouts, tr.ProxyStartTimeout)
				}
			}
			pp := tr.Policies
			evalBase := ""
			if pp.EvaluationBaseline.Mode.Valid() {
				evalBase = pp.EvaluationBaseline.String()
			}
			for _, c := range []struct{ phase, got, want string }{
				{"baseline", pp.Baseline.String(), tc.baseline},
				{"run", pp.Run.String(), tc.run},
				{"evaluation", pp.Evaluation.String(), tc.evalu},
				{"evaluation_baseline", evalBase, tc.evaluationBaseline},
			} {
				if c.got != c.want {
					t.Errorf("%s policy %s, want %s", c.phase, c.got, c.want)
				}
			}
		})
	}
}

// TestCheckTask: what the runner needs of a task is refused with the plan's problems,
// naming the task and the field.
func TestCheckTask(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"no image", "task_id: a\nrun: [x]\n", `task "a": image: is required`},
		{"no run", "task_id: a\nimage: i\n", `task "a": run: is required`},
		{"run empty", "task_id: a\nimage: i\nrun: []\n", "run: is required"},
		{"fresh without evaluation image", "task_id: a\nimage: i\nrun: [x]\nevaluation_mode: fresh\n", "evaluation_image: is required"},
		{"evaluation image in shared mode", "task_id: a\nimage: i\nrun: [x]\nevaluation_image: g\n", "evaluation_image: is only used in fresh evaluation mode"},
		{"with the plan's own", "task_id: a\nprovider: host_process\nrun_network_policy: no-network\n",
			"task \"a\": run_network_policy \"no-network\": provider host_process, run phase: cannot enforce no-network (it supports public); host_process provides no network isolation\ntask \"a\": image: is required\ntask \"a\": run: is required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := planChecked(filepath.Join(t.TempDir(), "task.yaml"), tc.doc)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
