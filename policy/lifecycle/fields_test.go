package lifecycle

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// TestParse: the fields come typed, the problems name the field and carry the value
// when it is to be shown, in a fixed order, and keys that are not the runner's are left
// to the caller.
func TestParse(t *testing.T) {
	obj := map[string]any{
		"task_id":   "a",
		"image":     "i",
		"run":       []any{"agent --task /t", []any{"x", "two words"}},
		"artifacts": []any{"/out", 7},
		"retain":    true,
		"timeouts":  map[string]any{"run": json.Number("1.5"), "open": "2m", "lunch": "1h"},
	}
	f, problems := Parse(obj)
	want := Fields{
		Image: "i", Run: []Command{{"agent", "--task", "/t"}, {"x", "two words"}}, Artifacts: []string{"/out"},
		Retain: true, Timeouts: map[StepName]time.Duration{StepRun: 1500 * time.Millisecond, StepOpen: 2 * time.Minute},
	}
	if !reflect.DeepEqual(f, want) {
		t.Errorf("fields\n%#v\nwant\n%#v", f, want)
	}
	wantProblems := []Problem{
		{Field: "artifacts[1]", Value: 7, Shown: true, Rule: "must be a non-empty string"},
		{Field: "timeouts.lunch", Rule: "unknown step (known: open, prepare, harness_start, run, harness_close, collect, download, evaluation_open, upload_artifacts, evaluate)"},
	}
	if !reflect.DeepEqual(problems, wantProblems) {
		t.Errorf("problems\n%#v\nwant\n%#v", problems, wantProblems)
	}
}
