package policy

import (
	"slices"
	"strings"
	"testing"
)

func parseTaskDoc(t *testing.T, doc string) ([]Task, error) {
	t.Helper()
	v, err := DecodeDocument([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return ParseTasks(v, "task.yaml")
}

// TestParseRunnerFieldsRefuses: each runner field's form is checked with the task, the
// message naming the field, the value when there is one, and the rule.
func TestParseRunnerFieldsRefuses(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"bad command", "task_id: a\nrun: [\"x 'y\"]\n", "run[0]: unterminated"},
		{"bad timeout", "task_id: a\ntimeouts: {run: soon}\n", `timeouts.run: "soon" is not a duration`},
		{"unknown timeout step", "task_id: a\ntimeouts: {lunch: 1m}\n", "timeouts.lunch: unknown step (known: open, prepare, harness_start, run, harness_close, collect, download, evaluation_open, upload_artifacts, evaluate)"},
		{"unknown harness key", "task_id: a\nharness: {begin: [x]}\n", "harness.begin: unknown key"},
		{"save_artifacts not a bool", "task_id: a\nsave_artifacts: yes please\n", `save_artifacts "yes please": must be true or false`},
		{"retain not a bool", "task_id: a\nretain: 1\n", `retain 1: must be true or false`},
		{"image not a string", "task_id: a\nimage: [i]\n", `image ["i"]: must be a non-empty string`},
		{"image blank", "task_id: a\nimage: '  '\n", `image "  ": must be a non-empty string`},
		{"evaluation image blank", "task_id: a\nevaluation_image: ''\n", `evaluation_image "": must be a non-empty string`},
		{"empty argument list", "task_id: a\nrun: [[]]\n", "run[0]: is an empty command"},
		{"command not a string or list", "task_id: a\nrun: [5]\n", "run[0] 5: must be a string or a list of strings"},
		{"commands not a list", "task_id: a\nevaluate: grade\n", `evaluate "grade": must be a list of commands`},
		{"zero timeout", "task_id: a\ntimeouts: {run: 0}\n", "timeouts.run: must be positive"},
		{"timeouts not an object", "task_id: a\ntimeouts: 5m\n", `timeouts "5m": must be an object of step: duration`},
		{"artifacts not a list", "task_id: a\nartifacts: /out\n", `artifacts "/out": must be a list of strings`},
		{"artifact empty", "task_id: a\nartifacts: [\"\"]\n", `artifacts[0] "": must be a non-empty string`},
		{"artifact not a string", "task_id: a\nartifacts: [/out, 7]\n", `artifacts[1] 7: must be a non-empty string`},
		{"artifact is the root", "task_id: a\nartifacts: [/out, /.., .]\n", `artifacts[1] "/..": names the container's whole file system`},
		{"artifact is the working directory", "task_id: a\nartifacts: [.]\n", `artifacts[0] ".": names the container's whole file system`},
		{"argument not a string", "task_id: a\nrun: [[grade, {x: 1}]]\n", `run[0] {"x":1}: argument lists hold strings only`},
		{"harness not an object", "task_id: a\nharness: [hs]\n", `harness ["hs"]: must be an object with start and close`},
		// 1e10 s does not fit a time.Duration: converted as it stood, it became negative
		// ("must be positive") on amd64 and was accepted as 292 years on arm64.
		{"timeout too long", "task_id: a\ntimeouts: {run: 1e10}\n", "timeouts.run: 1e10 seconds is longer than the longest timeout"},
		{"in a list: the task's position", "- task_id: a\n- task_id: b\n  run: [[]]\n", "[1].run[0]: is an empty command"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseTaskDoc(t, tc.doc)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestParseRunnerFieldsErrorOrder: the problems of a task come in the same order on
// every run (keys sorted), so that reruns and tests compare like for like.
func TestParseRunnerFieldsErrorOrder(t *testing.T) {
	want := `harness.alpha: unknown key (known: start, close)
harness.beta: unknown key (known: start, close)
harness.close 5: must be a list of commands
harness.delta: unknown key (known: start, close)
harness.eta: unknown key (known: start, close)
harness.zeta: unknown key (known: start, close)`
	for range 5 {
		_, err := parseTaskDoc(t, "task_id: a\nimage: i\nrun: [x]\nharness: {zeta: [x], eta: [x], delta: [x], close: 5, beta: [x], alpha: [x]}\n")
		if err == nil || err.Error() != want {
			t.Fatalf("err =\n%v\nwant\n%s", err, want)
		}
	}
}

// TestParseTasksKeepsTheSoundTasks: a list with a broken task still returns the others,
// so that their plans' problems can be reported in the same pass.
func TestParseTasksKeepsTheSoundTasks(t *testing.T) {
	tasks, err := parseTaskDoc(t, "- {task_id: a, run: [x]}\n- {task_id: b, timeouts: {run: -1s}}\n- {task_id: c}\n- {task_id: a}\n")
	if err == nil || !strings.Contains(err.Error(), "[1].timeouts.run: must be positive") || !strings.Contains(err.Error(), "appears twice") {
		t.Errorf("err = %v", err)
	}
	var ids []string
	for _, tk := range tasks {
		ids = append(ids, tk.ID)
	}
	if !slices.Equal(ids, []string{"a", "c"}) {
		t.Errorf("tasks %q, want a and c (b is broken, the second a repeats an ID)", ids)
	}
}
