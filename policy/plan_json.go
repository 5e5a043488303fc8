package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// planJSON is the wire form of a plan (compassctl plan --json), fields in this order.
type planJSON struct {
	TaskID                        string                     `json:"task_id"`
	Provider                      string                     `json:"provider"`
	EvaluationMode                EvaluationMode             `json:"evaluation_mode"`
	Policies                      phasesJSON[ResolvedPolicy] `json:"policies"`
	BaselineNetworkMode           Mode                       `json:"baseline_network_mode"`
	RunNetworkMode                Mode                       `json:"run_network_mode"`
	EvaluationNetworkMode         Mode                       `json:"evaluation_network_mode"`
	EvaluationBaselineNetworkMode Mode                       `json:"evaluation_baseline_network_mode,omitempty"`
	AppliedRecipes                []string                   `json:"applied_recipes"`
	Notice                        *string                    `json:"notice"`
	Native                        *phasesJSON[NativeOptions] `json:"native"`
	Steps                         []Step                     `json:"steps"`
}

// phasesJSON writes per-phase values in phase order; the evaluation baseline only in
// fresh mode.
type phasesJSON[T any] struct {
	Baseline           T  `json:"baseline"`
	Run                T  `json:"run"`
	Evaluation         T  `json:"evaluation"`
	EvaluationBaseline *T `json:"evaluation_baseline,omitempty"`
}

func newPhasesJSON[T any](m map[Phase]T) phasesJSON[T] {
	out := phasesJSON[T]{Baseline: m[PhaseBaseline], Run: m[PhaseRun], Evaluation: m[PhaseEvaluation]}
	if v, ok := m[PhaseEvaluationBaseline]; ok {
		out.EvaluationBaseline = &v
	}
	return out
}

// MarshalJSON writes the plan as compassctl plan --json prints it.
func (p *Plan) MarshalJSON() ([]byte, error) {
	w := planJSON{
		TaskID:                p.TaskID,
		Provider:              p.Provider,
		EvaluationMode:        p.EvaluationMode,
		Policies:              newPhasesJSON(p.Policies),
		BaselineNetworkMode:   p.Policy(PhaseBaseline).Mode,
		RunNetworkMode:        p.Policy(PhaseRun).Mode,
		EvaluationNetworkMode: p.Policy(PhaseEvaluation).Mode,
		AppliedRecipes:        p.AppliedRecipes,
		Steps:                 p.Steps,
	}
	if w.AppliedRecipes == nil {
		w.AppliedRecipes = []string{}
	}
	if p.EvaluationMode == EvaluationFresh {
		w.EvaluationBaselineNetworkMode = p.Policy(PhaseEvaluationBaseline).Mode
	}
	if p.Notice != "" {
		w.Notice = &p.Notice
	}
	if p.Native != nil {
		n := newPhasesJSON(p.Native)
		w.Native = &n
	}
	// The statement's '<' and '>' stay as written: json.Marshal would escape them, and
	// an encoder that does not escape cannot undo that in a nested Marshaler.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(w); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// MarshalPlans writes plans as compassctl plan --json prints them: a JSON array,
// indented by two spaces, with '<' and '>' of the restriction statement left as they are.
func MarshalPlans(plans []*Plan) ([]byte, error) {
	if plans == nil {
		plans = []*Plan{}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(plans); err != nil {
		return nil, fmt.Errorf("policy: plan: %w", err)
	}
	return buf.Bytes(), nil
}
