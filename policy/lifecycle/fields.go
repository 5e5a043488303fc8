package lifecycle

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Command is one argv the runner runs with Exec (no shell: the task images may have none).
type Command []string

// HarnessSession is a declared harness session: steps 3 and 5 exist only with one.
type HarnessSession struct {
	Start []Command `json:"start"`
	Close []Command `json:"close"`
}

// Fields are the task fields the lifecycle runner reads, as the task file declares
// them. The planner checks their form; what a run requires of them (an image, run
// commands) the runner checks, since `compassctl plan` takes a task without them.
type Fields struct {
	Image           string
	EvaluationImage string
	Prepare         []Command
	Harness         *HarnessSession
	Run             []Command
	Collect         []Command
	Artifacts       []string
	// SaveArtifacts is nil when the file leaves it out.
	SaveArtifacts *bool
	Evaluate      []Command
	Retain        bool
	Timeouts      map[StepName]time.Duration
}

// A Problem is one field that breaks a rule. The caller reports it in its own error
// style; Value, the field's value as decoded, is to be shown when Shown is set.
type Problem struct {
	Field string
	Value any
	Shown bool
	Rule  string
}

// fieldParser collects the problems of one task's fields.
type fieldParser struct{ problems *[]Problem }

func (d fieldParser) fail(field, rule string) {
	*d.problems = append(*d.problems, Problem{Field: field, Rule: rule})
}

// failValue is fail for a value that is there but wrong: the message shows it.
func (d fieldParser) failValue(field string, raw any, rule string) {
	*d.problems = append(*d.problems, Problem{Field: field, Value: raw, Shown: true, Rule: rule})
}

// Parse reads the runner's fields of a task object decoded from a task file (a tree of
// map[string]any, []any, string, json.Number, bool and nil), checking their form. It
// reads them in a fixed order (image, evaluation_image, prepare, harness, run, collect,
// artifacts, save_artifacts, evaluate, retain, timeouts), the keys of an object sorted,
// so that the problems come in the same order on every run. Other keys are the caller's.
func Parse(obj map[string]any) (Fields, []Problem) {
	var problems []Problem
	d := fieldParser{problems: &problems}
	var f Fields
	f.Image = d.str(obj, "image")
	f.EvaluationImage = d.str(obj, "evaluation_image")
	f.Prepare = d.commands(obj, "prepare")
	if raw, ok := obj["harness"]; ok {
		f.Harness = d.harness(raw)
	}
	f.Run = d.commands(obj, "run")
	f.Collect = d.commands(obj, "collect")
	f.Artifacts = d.artifacts(obj)
	if raw, ok := obj["save_artifacts"]; ok {
		b := d.boolean(raw, "save_artifacts")
		f.SaveArtifacts = &b
	}
	f.Evaluate = d.commands(obj, "evaluate")
	if raw, ok := obj["retain"]; ok {
		f.Retain = d.boolean(raw, "retain")
	}
	if raw, ok := obj["timeouts"]; ok {
		f.Timeouts = d.timeouts(raw)
	}
	return f, problems
}

// str reads an optional string field; "" when absent or wrong.
func (d fieldParser) str(obj map[string]any, key string) string {
	raw, ok := obj[key]
	if !ok {
		return ""
	}
	s, ok := raw.(string)
	if !ok || strings.TrimSpace(s) == "" {
		d.failValue(key, raw, "must be a non-empty string")
		return ""
	}
	return s
}

func (d fieldParser) boolean(raw any, key string) bool {
	b, ok := raw.(bool)
	if !ok {
		d.failValue(key, raw, "must be true or false")
	}
	return b
}

// artifacts reads the paths to save. A path naming the container's root would be saved
// as the task's own output directory (artifacts/ is the root's copy), next to its records.
func (d fieldParser) artifacts(obj map[string]any) []string {
	raw, ok := obj["artifacts"]
	if !ok {
		return nil
	}
	list, ok := raw.([]any)
	if !ok {
		d.failValue("artifacts", raw, "must be a list of strings")
		return nil
	}
	out := make([]string, 0, len(list))
	for i, v := range list {
		at := fmt.Sprintf("artifacts[%d]", i)
		s, ok := v.(string)
		switch {
		case !ok || s == "":
			d.failValue(at, v, "must be a non-empty string")
		case path.Clean("/"+s) == "/":
			d.failValue(at, v, "names the container's whole file system; give the files or directories to save")
		default:
			out = append(out, s)
		}
	}
	return out
}

// commands reads a list of commands: each a string (split into words as a shell would,
// quotes kept together; no shell runs it) or a list of argument strings.
func (d fieldParser) commands(obj map[string]any, key string) []Command {
	raw, ok := obj[key]
	if !ok {
		return nil
	}
	return d.commandList(raw, key)
}

func (d fieldParser) commandList(raw any, field string) []Command {
	list, ok := raw.([]any)
	if !ok {
		d.failValue(field, raw, "must be a list of commands")
		return nil
	}
	var out []Command
	for i, v := range list {
		if c := d.command(v, fmt.Sprintf("%s[%d]", field, i)); c != nil {
			out = append(out, c)
		}
	}
	return out
}

// command reads one command; nil when it is wrong.
func (d fieldParser) command(v any, at string) Command {
	switch c := v.(type) {
	case string:
		argv, err := splitWords(c)
		if err != nil {
			d.fail(at, err.Error())
			return nil
		}
		return argv
	case []any:
		argv := make(Command, 0, len(c))
		for _, a := range c {
			s, ok := a.(string)
			if !ok {
				d.failValue(at, a, "argument lists hold strings only")
				return nil
			}
			argv = append(argv, s)
		}
		if len(argv) == 0 {
			d.fail(at, "is an empty command")
			return nil
		}
		return argv
	default:
		d.failValue(at, v, "must be a string or a list of strings")
		return nil
	}
}

func (d fieldParser) harness(raw any) *HarnessSession {
	obj, ok := raw.(map[string]any)
	if !ok {
		d.failValue("harness", raw, "must be an object with start and close")
		return nil
	}
	h := &HarnessSession{}
	// In key order, so that the problems come in the same order on every run.
	for _, k := range sortedKeys(obj) {
		v := obj[k]
		switch k {
		case "start":
			h.Start = d.commandList(v, "harness.start")
		case "close":
			h.Close = d.commandList(v, "harness.close")
		default:
			d.fail("harness."+k, "unknown key (known: start, close)")
		}
	}
	return h
}

func (d fieldParser) timeouts(raw any) map[StepName]time.Duration {
	obj, ok := raw.(map[string]any)
	if !ok {
		d.failValue("timeouts", raw, "must be an object of step: duration")
		return nil
	}
	names := make([]string, len(TimeoutSteps))
	for i, k := range TimeoutSteps {
		names[i] = string(k)
	}
	out := map[StepName]time.Duration{}
	for _, k := range sortedKeys(obj) {
		if !slices.Contains(names, k) {
			d.fail("timeouts."+k, "unknown step (known: "+strings.Join(names, ", ")+")")
			continue
		}
		dur, err := parseTimeout(obj[k])
		if err != nil {
			d.fail("timeouts."+k, err.Error())
			continue
		}
		out[StepName(k)] = dur
	}
	return out
}

func sortedKeys(obj map[string]any) []string {
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// parseTimeout accepts a Go duration ("10m", "90s") or a number of seconds.
func parseTimeout(v any) (time.Duration, error) {
	var dur time.Duration
	switch x := v.(type) {
	case string:
		dd, err := time.ParseDuration(x)
		if err != nil {
			return 0, fmt.Errorf("%q is not a duration (e.g. 90s, 10m)", x)
		}
		dur = dd
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil || math.IsNaN(f) {
			return 0, fmt.Errorf("%s is not a number of seconds", x)
		}
		// Checked before converting: a float beyond int64 converts to whatever the
		// platform gives (negative on amd64, the maximum on arm64).
		if f >= float64(math.MaxInt64)/float64(time.Second) {
			return 0, fmt.Errorf("%s seconds is longer than the longest timeout, %s", x, time.Duration(math.MaxInt64))
		}
		dur = time.Duration(f * float64(time.Second))
	default:
		return 0, errors.New("must be a duration string or a number of seconds")
	}
	if dur <= 0 {
		return 0, errors.New("must be positive")
	}
	return dur, nil
}
