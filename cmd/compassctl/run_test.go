package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/controllertest"
	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/policy"
)

func TestSplitWords(t *testing.T) {
	tests := []struct {
		in   string
		want []string
		err  string
	}{
		{"fetch http://packages.test/tool.tar", []string{"fetch", "http://packages.test/tool.tar"}, ""},
		{"  a   b\tc ", []string{"a", "b", "c"}, ""},
		{`grade --msg 'two words' "and \"more\""`, []string{"grade", "--msg", "two words", `and "more"`}, ""},
		{`a\ b ''`, []string{"a b", ""}, ""},
		{`\a b`, []string{"a", "b"}, ""},
		{"a\nb", []string{"a", "b"}, ""},
		{`x 'open`, nil, "unterminated ' quote"},
		{`x \`, nil, "lone backslash"},
		{"   ", nil, "empty command"},
	}
	for _, tc := range tests {
		got, err := splitWords(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("splitWords(%q) error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("splitWords(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func planOf(t *testing.T, doc string) *policy.Plan {
	t.Helper()
	return planAt(t, filepath.Join(t.TempDir(), "task.yaml"), doc)
}

// planAt plans the one task doc holds, written to file (whose name is in the plan).
func planAt(t *testing.T, file, doc string) *policy.Plan {
	t.Helper()
	if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	tasks, err := policy.LoadTasks(file)
	if err != nil {
		t.Fatal(err)
	}
	var pl policy.Planner
	p, err := pl.Plan(tasks[0])
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTaskRunOfExample(t *testing.T) {
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
	tr, err := taskRunOf(p)
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
	if !slices.Equal(tr.Prepare[0], controller.Command{"fetch", "http://packages.test/tool.tar"}) ||
		!slices.Equal(tr.Harness.Close[0], controller.Command{"hc", "two words"}) || len(tr.Harness.Start) != 1 {
		t.Errorf("commands %+v %+v", tr.Prepare, tr.Harness)
	}
	want := map[policy.StepName]time.Duration{"prepare": 10 * time.Minute, "run": 90 * time.Second, "evaluate": 1500 * time.Millisecond}
	for k, v := range want {
		if tr.Timeouts[k] != v {
			t.Errorf("timeout %s = %s, want %s", k, tr.Timeouts[k], v)
		}
	}
	if !bytes.Contains(tr.Plan, []byte(`"run_network_mode":"allowlist"`)) {
		t.Errorf("plan %s", tr.Plan)
	}
}

// TestTaskRunOfDigest checks that the task a plan becomes has a digest in both modes,
// and one that changes with the definition: --resume compares records by it.
func TestTaskRunOfDigest(t *testing.T) {
	tests := []struct{ mode, extra string }{
		{"shared", ""},
		{"fresh", "evaluation_image: grader:1\n"},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "task.yaml") // one file: its name is in the plan
			digest := func(run string) string {
				doc := "task_id: d-1\nevaluation_mode: " + tc.mode + "\nimage: agent:1\n" + tc.extra + "run: [" + run + "]\n"
				tr, err := taskRunOf(planAt(t, file, doc))
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

func TestTaskRunOfRefusals(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"no image", "task_id: a\nrun: [x]\n", `task "a": image: is required`},
		{"no run", "task_id: a\nimage: i\n", "run: is required"},
		{"fresh without evaluation image", "task_id: a\nimage: i\nrun: [x]\nevaluation_mode: fresh\n", "evaluation_image: is required"},
		{"evaluation image in shared mode", "task_id: a\nimage: i\nrun: [x]\nevaluation_image: g\n", "only used in fresh"},
		{"bad command", "task_id: a\nimage: i\nrun: [\"x 'y\"]\n", "run[0]: unterminated"},
		{"bad timeout", "task_id: a\nimage: i\nrun: [x]\ntimeouts: {run: soon}\n", `timeouts.run: "soon" is not a duration`},
		{"unknown timeout step", "task_id: a\nimage: i\nrun: [x]\ntimeouts: {lunch: 1m}\n", "timeouts.lunch: unknown step"},
		{"unknown harness key", "task_id: a\nimage: i\nrun: [x]\nharness: {begin: [x]}\n", "harness.begin: unknown key"},
		{"save_artifacts not a bool", "task_id: a\nimage: i\nrun: [x]\nsave_artifacts: yes please\n", `save_artifacts "yes please": must be true or false`},
		{"image not a string", "task_id: a\nimage: [i]\nrun: [x]\n", `image ["i"]: must be a non-empty string`},
		{"image blank", "task_id: a\nimage: '  '\nrun: [x]\n", `image "  ": must be a non-empty string`},
		{"run empty", "task_id: a\nimage: i\nrun: []\n", "run: is required"},
		{"empty argument list", "task_id: a\nimage: i\nrun: [[]]\n", "run[0]: is an empty command"},
		{"command not a string or list", "task_id: a\nimage: i\nrun: [5]\n", "run[0] 5: must be a string or a list of strings"},
		{"zero timeout", "task_id: a\nimage: i\nrun: [x]\ntimeouts: {run: 0}\n", "timeouts.run: must be positive"},
		{"timeouts not an object", "task_id: a\nimage: i\nrun: [x]\ntimeouts: 5m\n", `timeouts "5m": must be an object of step: duration`},
		{"artifacts not a list", "task_id: a\nimage: i\nrun: [x]\nartifacts: /out\n", `artifacts "/out": must be a list of strings`},
		{"artifact empty", "task_id: a\nimage: i\nrun: [x]\nartifacts: [\"\"]\n", `artifacts[0] "": must be a non-empty string`},
		{"artifact not a string", "task_id: a\nimage: i\nrun: [x]\nartifacts: [/out, 7]\n", `artifacts[1] 7: must be a non-empty string`},
		{"artifact is the root", "task_id: a\nimage: i\nrun: [x]\nartifacts: [/out, /.., .]\n", `artifacts[1] "/..": names the container's whole file system`},
		{"artifact is the working directory", "task_id: a\nimage: i\nrun: [x]\nartifacts: [.]\n", `artifacts[0] ".": names the container's whole file system`},
		{"argument not a string", "task_id: a\nimage: i\nrun: [[grade, {x: 1}]]\n", `run[0] {"x":1}: argument lists hold strings only`},
		{"harness not an object", "task_id: a\nimage: i\nrun: [x]\nharness: [hs]\n", `harness ["hs"]: must be an object with start and close`},
		// 1e10 s does not fit a time.Duration: converted as it stood, it became negative
		// ("must be positive") on amd64 and was accepted as 292 years on arm64.
		{"timeout too long", "task_id: a\nimage: i\nrun: [x]\ntimeouts: {run: 1e10}\n", "timeouts.run: 1e10 seconds is longer than the longest timeout"},
		{"other provider", "task_id: a\nprovider: modal\nimage: i\nrun: [x]\n", "drives the docker provider only"},
		// The planner takes 64 characters; Docker names take 63, and the open that refused
		// it came after other tasks of the run had started.
		{"task ID too long for docker", "task_id: " + strings.Repeat("t", 64) + "\nimage: i\nrun: [x]\n", "task_id: docker: task ID"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := taskRunOf(planOf(t, tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestTaskRunOfErrorOrder: the problems of a task come in the same order on every run
// (keys sorted), so that reruns and tests compare like for like.
func TestTaskRunOfErrorOrder(t *testing.T) {
	p := planOf(t, "task_id: a\nimage: i\nrun: [x]\nharness: {zeta: [x], eta: [x], delta: [x], close: 5, beta: [x], alpha: [x]}\n")
	want := `task "a": harness.alpha: unknown key (known: start, close)
task "a": harness.beta: unknown key (known: start, close)
task "a": harness.close 5: must be a list of commands
task "a": harness.delta: unknown key (known: start, close)
task "a": harness.eta: unknown key (known: start, close)
task "a": harness.zeta: unknown key (known: start, close)`
	for range 5 {
		if _, err := taskRunOf(p); err == nil || err.Error() != want {
			t.Fatalf("err =\n%v\nwant\n%s", err, want)
		}
	}
}

// TestTaskRunOfNetwork: a Docker network asked for through --env-params is refused
// rather than silently replaced by the task's own internal network.
func TestTaskRunOfNetwork(t *testing.T) {
	for _, tc := range []struct{ network, want string }{
		{"", ""},
		{"bridge", ""},
		{"my-custom-net", `network: "my-custom-net": compassctl run puts every task on its own internal bridge network`},
	} {
		p := planOf(t, "task_id: a\nimage: i\nrun: [x]\n")
		p.Network = tc.network
		_, err := taskRunOf(p)
		if tc.want == "" && err != nil {
			t.Errorf("network %q: %v", tc.network, err)
		}
		if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("network %q: err = %v, want %q", tc.network, err, tc.want)
		}
	}
}

func TestPrepareOutputs(t *testing.T) {
	out := t.TempDir()
	fake := controllertest.New()
	r := &controller.Runner{Provider: fake, OutDir: out}
	done := controller.TaskRun{ID: "done", Mode: policy.EvaluationShared, Image: "i",
		Policies: controller.PhasePolicies{Baseline: policy.Public, Run: policy.NoNetwork, Evaluation: policy.NoNetwork},
		Run:      []controller.Command{{"x"}}}
	if _, err := r.RunTask(t.Context(), done, nil); err != nil {
		t.Fatal(err)
	}
	fresh := done
	fresh.ID = "new"

	run, prevs, skipped, err := prepareOutputs(out, []controller.TaskRun{done, fresh}, true, fake)
	if err != nil || len(run) != 1 || run[0].ID != "new" || len(prevs) != 0 || !slices.Equal(skipped, []string{"done"}) {
		t.Errorf("resume: run %v prevs %v skipped %v err %v", run, prevs, skipped, err)
	}
	changed := done
	changed.Run = []controller.Command{{"y"}}
	if _, _, _, err := prepareOutputs(out, []controller.TaskRun{changed}, true, fake); err != nil {
		t.Errorf("a finished task is skipped before its definition is compared: %v", err)
	}
	// Without --resume the old record is cleared and the task runs again.
	run, _, _, err = prepareOutputs(out, []controller.TaskRun{done}, false, fake)
	if err != nil || len(run) != 1 {
		t.Fatalf("fresh run: %v %v", run, err)
	}
	if _, err := os.Stat(filepath.Join(out, "done", controller.RecordFile)); !os.IsNotExist(err) {
		t.Errorf("old record not cleared: %v", err)
	}
}

// TestRunRefusesBeforeStarting: an invalid task (or plan) is exit status 2 before any
// provider is contacted, with every problem named.
func TestRunRefusesBeforeStarting(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"bad.yaml":     "task_id: a\nimage: i\nrun: [x]\nrun_network_policy: {network_mode: allowlist}\n",
		"noimage.yaml": "- {task_id: b, run: [x]}\n- {task_id: d, image: i, run: [x], timeouts: {run: -1s}}\n",
		"good.yaml":    "task_id: c\nimage: i\nrun: [x]\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bad, good := filepath.Join(dir, "bad.yaml"), filepath.Join(dir, "good.yaml")
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"invalid plan", []string{"run", bad}, []string{"allowed_hosts"}},
		{"runner fields", []string{"run", good, filepath.Join(dir, "noimage.yaml")}, []string{`task "b": image: is required`, `task "d": timeouts.run: must be positive`}},
		{"bad env-params", []string{"run", good, "--env-params", `{"run_network_policy":"sometimes"}`}, []string{"--env-params"}},
		{"bad concurrency", []string{"run", good, "--concurrency", "0"}, []string{"--concurrency must be at least 1"}},
		{"no task file", []string{"run"}, []string{"at least one TASK_FILE"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stderr := captureStderr(t, func() {
				if code := run(tc.args); code != 2 {
					t.Errorf("exit status %d, want 2", code)
				}
			})
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q does not name %q", stderr, w)
				}
			}
		})
	}
}

func captureStderr(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = w
	done := make(chan string)
	go func() {
		var b bytes.Buffer
		_, _ = b.ReadFrom(r)
		done <- b.String()
	}()
	f()
	os.Stderr = old
	w.Close()
	return <-done
}

// TestRunRefusesATaskAnotherRunHolds: another compassctl run (another --out, the same
// state directory and owner) holds the task's run lock. This run records the task
// refused, naming the task and the lock, and exits 1 like any task that did not
// succeed; it never reaches Docker (DOCKER_HOST names a socket nothing listens on).
func TestRunRefusesATaskAnotherRunHolds(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(dir, "no-docker.sock"))
	state, out := filepath.Join(dir, "state"), filepath.Join(dir, "out")
	file := filepath.Join(dir, "task.yaml")
	if err := os.WriteFile(file, []byte("task_id: c\nimage: i\nrun: [x]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	other, err := docker.New(nil, docker.Config{StateDir: state, Owner: "o"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := other.LockTask(t.Context(), "c")
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()

	var stdout bytes.Buffer
	root := newRootCommand()
	root.SetOut(&stdout)
	root.SetArgs([]string{"run", file, "--out", out, "--state-dir", state, "--owner", "o", "--progress", "plain"})
	err = root.Execute()
	var ue usageError
	if err == nil || errors.As(err, &ue) || !strings.Contains(err.Error(), "1 of 1 tasks did not succeed") {
		t.Errorf("run: %v, want a task that did not succeed (exit 1)", err)
	}
	for _, want := range []string{"refused", "task c", "another compassctl run holds", other.RunLockPath("c")} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output does not say %q:\n%s", want, stdout.String())
		}
	}
	rec, err := controller.ReadRecord(filepath.Join(out, "c"))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != controller.StatusRefused || len(rec.Steps) != 0 {
		t.Errorf("record: status %s, steps %d; want refused with no step", rec.Status, len(rec.Steps))
	}
}
