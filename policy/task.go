package policy

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// Task is one task as a task file declares it. Fields the file leaves out stay at their
// zero value so that resolution can tell "not set" from "set to the default".
type Task struct {
	ID string
	// Provider is the provider the task asks for; "" when the file names none.
	Provider string
	// EvaluationMode is shared or fresh; "" when the file sets none.
	EvaluationMode EvaluationMode
	// Policies holds the policy fields the task sets (the task source of docs/policy.md §6).
	// The verifier baseline (evaluation_baseline_network_policy) may also come from
	// evaluation_environment.baseline_network_policy.
	Policies PhasePolicies
	// EvaluationEnvironment is true when the task declares its own evaluation
	// environment; declared without a baseline it starts under public, not under the
	// agent's baseline.
	EvaluationEnvironment bool
	// InjectNotice is the task's inject_network_restriction_notice; nil means the
	// default (true).
	InjectNotice *bool
	// Runner holds the runner's fields (image, prepare, run, ...), their form checked.
	Runner lifecycle.Fields
	// Origin says where the task was read, for error messages: "tasks.yaml[2]".
	Origin string
}

// taskKeys are the fields the planner itself reads.
var taskKeys = []string{
	"task_id", "provider", "evaluation_mode",
	"baseline_network_policy", "run_network_policy", "evaluation_network_policy",
	"evaluation_baseline_network_policy", "evaluation_environment",
	"inject_network_restriction_notice",
}

var evaluationEnvironmentKeys = []string{"baseline_network_policy"}

// taskIDPattern keeps task IDs usable in container, network and file names.
var taskIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// LoadTasks reads a task file (JSON or YAML) holding one task or a list of tasks. On
// error it also returns the tasks that have no problem of their own (see ParseTasks).
func LoadTasks(path string) ([]Task, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: task file: %w", err)
	}
	v, err := DecodeDocument(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	tasks, err := ParseTasks(v, path)
	if err != nil {
		return tasks, prefixLines(path+": ", err)
	}
	return tasks, nil
}

// ParseTasks validates a decoded task document: one task object or a list of them.
// origin names the document in each task's Origin. Every problem is reported together;
// paths start with "[i]" for the i-th task of a list. On error it also returns the tasks
// that have no problem of their own (nor repeat an earlier task's ID), so that a caller
// can report the problems of their plans in the same pass.
func ParseTasks(v any, origin string) ([]Task, error) {
	var errs ErrorList
	var tasks []Task
	switch x := v.(type) {
	case map[string]any:
		if t, ok := parseTaskInto(x, "", &errs); ok {
			t.Origin = origin
			tasks = append(tasks, t)
		}
	case []any:
		if len(x) == 0 {
			errs.add(&FieldError{Rule: "the task list is empty"})
		}
		for i, item := range x {
			path := fmt.Sprintf("[%d]", i)
			obj, ok := item.(map[string]any)
			if !ok {
				errs.add(&FieldError{Path: path, Value: display(item), Rule: "a task is an object, not " + describe(item)})
				continue
			}
			if t, ok := parseTaskInto(obj, path, &errs); ok {
				t.Origin = fmt.Sprintf("%s%s", origin, path)
				tasks = append(tasks, t)
			}
		}
	default:
		errs.add(&FieldError{Value: display(v), Rule: "a task file holds a task object or a list of task objects, not " + describe(v)})
	}
	seen := map[string]string{}
	unique := tasks[:0]
	for _, t := range tasks {
		if first, dup := seen[t.ID]; dup {
			errs.add(&FieldError{Path: "task_id", Value: display(t.ID), Rule: "appears twice (" + first + " and " + t.Origin + "); task IDs must be unique"})
			continue
		}
		seen[t.ID] = t.Origin
		unique = append(unique, t)
	}
	if len(errs) > 0 {
		return unique, errs
	}
	return tasks, nil
}

// parseTaskInto parses one task, adding its problems to errs; ok is false if it has any.
func parseTaskInto(obj map[string]any, path string, errs *ErrorList) (Task, bool) {
	var own ErrorList
	t := parseTask(obj, path, &own)
	errs.add(own...)
	return t, len(own) == 0
}

func parseTask(obj map[string]any, path string, errs *ErrorList) Task {
	at := func(k string) string { return joinPath(path, k) }
	known := append(append([]string{}, taskKeys...), RunnerKeys...)
	checkKeys(obj, path, known, "a task", errs)

	var t Task
	switch id, ok := obj["task_id"]; {
	case !ok:
		errs.add(&FieldError{Path: at("task_id"), Rule: "is required"})
	default:
		s, isString := id.(string)
		if !isString || !taskIDPattern.MatchString(s) {
			errs.add(&FieldError{Path: at("task_id"), Value: display(id), Rule: "must be 1-64 characters of letters, digits, '.', '_' and '-', starting with a letter or digit"})
		} else {
			t.ID = s
		}
	}
	if raw, ok := obj["provider"]; ok {
		t.Provider = parseProviderName(raw, at("provider"), errs)
	}
	if raw, ok := obj["evaluation_mode"]; ok {
		t.EvaluationMode = parseEvaluationMode(raw, at("evaluation_mode"), errs)
	}
	t.Policies = parsePhasePolicies(obj, path, errs)
	if raw, ok := obj["evaluation_environment"]; ok {
		t.EvaluationEnvironment = true
		parseEvaluationEnvironment(raw, at("evaluation_environment"), &t, errs)
	}
	if raw, ok := obj["inject_network_restriction_notice"]; ok {
		if b, isBool := raw.(bool); isBool {
			t.InjectNotice = &b
		} else {
			errs.add(&FieldError{Path: at("inject_network_restriction_notice"), Value: display(raw), Rule: "must be true or false, not " + describe(raw)})
		}
	}
	t.Runner = parseRunnerFields(obj, path, errs)
	return t
}

// parseEvaluationEnvironment reads the declared evaluation environment. Its only field is
// the verifier's own baseline, a second spelling of evaluation_baseline_network_policy
// (Harbor's [verifier.environment]); giving both is refused rather than guessed.
func parseEvaluationEnvironment(raw any, path string, t *Task, errs *ErrorList) {
	obj, ok := raw.(map[string]any)
	if !ok {
		errs.add(&FieldError{Path: path, Value: display(raw), Rule: "must be an object ({} declares an evaluation environment with its own public baseline), not " + describe(raw)})
		return
	}
	checkKeys(obj, path, evaluationEnvironmentKeys, "evaluation_environment", errs)
	v, ok := obj["baseline_network_policy"]
	if !ok {
		return
	}
	if _, both := t.Policies[PhaseEvaluationBaseline]; both {
		errs.add(&FieldError{Path: joinPath(path, "baseline_network_policy"), Rule: "the task also sets evaluation_baseline_network_policy; give the verifier baseline once"})
		return
	}
	p, err := ParseValue(v, joinPath(path, "baseline_network_policy"))
	if err != nil {
		errs.add(FieldErrors(err)...)
		return
	}
	if t.Policies == nil {
		t.Policies = PhasePolicies{}
	}
	t.Policies[PhaseEvaluationBaseline] = p
}

// checkKeys reports every key of obj that is not in known, listing the known ones.
func checkKeys(obj map[string]any, path string, known []string, what string, errs *ErrorList) {
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !contains(known, k) {
			errs.add(&FieldError{Path: joinPath(path, Clip(k)), Rule: fmt.Sprintf("unknown key; %s takes only %s", what, strings.Join(known, ", "))})
		}
	}
}

func parseProviderName(raw any, path string, errs *ErrorList) string {
	s, ok := raw.(string)
	if ok {
		if _, known := LookupProvider(s); known {
			return s
		}
	}
	errs.add(&FieldError{Path: path, Value: display(raw), Rule: "unknown provider; use one of " + strings.Join(ProviderNames(), ", ")})
	return ""
}

func parseEvaluationMode(raw any, path string, errs *ErrorList) EvaluationMode {
	if s, ok := raw.(string); ok {
		if m := EvaluationMode(s); m.Valid() {
			return m
		}
	}
	errs.add(&FieldError{Path: path, Value: display(raw), Rule: "unknown evaluation mode; use shared or fresh"})
	return ""
}

// prefixLines puts prefix in front of every line of err's message, so that each error of
// a multi-error report still says where it comes from.
func prefixLines(prefix string, err error) error {
	return &prefixedError{prefix: prefix, err: err}
}

type prefixedError struct {
	prefix string
	err    error
}

func (e *prefixedError) Error() string {
	lines := strings.Split(e.err.Error(), "\n")
	for i, l := range lines {
		lines[i] = e.prefix + l
	}
	return strings.Join(lines, "\n")
}

func (e *prefixedError) Unwrap() error { return e.err }
