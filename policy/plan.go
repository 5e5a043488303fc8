package policy

import (
	"fmt"
	"time"
)

// Phase names one of a task's four policy fields. The fields are not four successive
// phases: see Steps for which one is in force at each lifecycle boundary.
type Phase string

const (
	PhaseBaseline           Phase = "baseline"
	PhaseRun                Phase = "run"
	PhaseEvaluation         Phase = "evaluation"
	PhaseEvaluationBaseline Phase = "evaluation_baseline"
)

// Phases lists the four fields in the order plans present them.
var Phases = []Phase{PhaseBaseline, PhaseRun, PhaseEvaluation, PhaseEvaluationBaseline}

// Field is the policy field's name: "run_network_policy".
func (p Phase) Field() string { return string(p) + "_network_policy" }

// ModeField is the name of the plan's summary field: "run_network_mode".
func (p Phase) ModeField() string { return string(p) + "_network_mode" }

// PhasePolicies holds the policy fields one source supplies. A phase that is absent is
// not supplied: resolution asks the next source.
type PhasePolicies map[Phase]Policy

// parsePhasePolicies reads the four policy fields present in obj.
func parsePhasePolicies(obj map[string]any, path string, errs *ErrorList) PhasePolicies {
	var out PhasePolicies
	for _, ph := range Phases {
		raw, ok := obj[ph.Field()]
		if !ok {
			continue
		}
		p, err := ParseValue(raw, joinPath(path, ph.Field()))
		if err != nil {
			errs.add(FieldErrors(err)...)
			continue
		}
		if out == nil {
			out = PhasePolicies{}
		}
		out[ph] = p
	}
	return out
}

// EvaluationMode says where a task is evaluated.
type EvaluationMode string

const (
	// EvaluationShared evaluates in the agent's own environment (reuse).
	EvaluationShared EvaluationMode = "shared"
	// EvaluationFresh evaluates in a second, separate evaluation environment.
	EvaluationFresh EvaluationMode = "fresh"
)

// Valid reports whether m is shared or fresh.
func (m EvaluationMode) Valid() bool { return m == EvaluationShared || m == EvaluationFresh }

// Sources of a resolved policy (docs/policy.md §6); a recipe's source is "recipe:<name>".
const (
	SourceOverride = "override"
	SourceTask     = "task"
	SourceDefault  = "default"
)

// RecipeSource is the source label of a policy supplied by the named recipe.
func RecipeSource(name string) string { return "recipe:" + name }

// ResolvedPolicy is the effective policy of one phase and the source that supplied it.
type ResolvedPolicy struct {
	Policy Policy `json:"policy"`
	Source string `json:"source"`
}

// Plan is one task's resolved execution plan: what will be in force when, checked
// against what the provider can enforce. The runner executes it as it stands.
type Plan struct {
	TaskID         string
	Provider       string
	EvaluationMode EvaluationMode
	// Policies has baseline, run and evaluation, and in fresh mode evaluation_baseline.
	Policies map[Phase]ResolvedPolicy
	// AppliedRecipes names every recipe that matched the task, in command-line order.
	AppliedRecipes []string
	// InjectNotice is false when the task turned the restriction statement off.
	InjectNotice bool
	// Notice is the restriction statement for the agent's final instruction; "" when
	// the run policy is public or InjectNotice is false.
	Notice string
	// Native holds the provider-native options per phase; nil for providers that take
	// none (docker enforces through its sidecar, host_process enforces nothing).
	Native map[Phase]NativeOptions
	// Steps are the lifecycle rows of docs/policy.md §7 with the policy in force at each.
	Steps []Step
	// Network is the Docker network mode asked for through --env-params ("" default).
	Network string
	// ProxyStartTimeout is allowlist_proxy_start_timeout (0: the provider's default).
	ProxyStartTimeout time.Duration
	// Task is the task as declared, for the runner's own fields.
	Task Task
}

// Phases lists the phases the plan has, in order.
func (p *Plan) Phases() []Phase {
	if p.EvaluationMode == EvaluationFresh {
		return Phases
	}
	return Phases[:3]
}

// Policy returns the effective policy of a phase. It panics on a phase the plan does
// not have (evaluation_baseline in shared mode), which is a programming error.
func (p *Plan) Policy(ph Phase) Policy {
	r, ok := p.Policies[ph]
	if !ok {
		panic(fmt.Sprintf("policy: plan of %q has no %s phase", p.TaskID, ph))
	}
	return r.Policy
}

// NativeOptions are one phase's provider-native request options, generated from the
// effective shared policy.
type NativeOptions map[string]any

// TaskError is a task's planning failure: every problem found, each line prefixed with
// the task it belongs to.
type TaskError struct {
	TaskID string
	Errs   ErrorList
}

func (e *TaskError) Error() string {
	return prefixLines("task "+Quote(e.TaskID)+": ", e.Errs).Error()
}

func (e *TaskError) Unwrap() error { return e.Errs }
