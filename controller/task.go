package controller

import (
	"encoding/json"
	"fmt"

	"github.com/compass-egress/compass-egress/policy"
)

// CheckTask reports what the runner needs of a plan's task that the planner does not
// ask for: an image, run commands, and an evaluation image exactly in fresh mode. It is
// a policy.Planner's Check, so that these problems come with the plan's own.
func CheckTask(p *policy.Plan) []*policy.FieldError {
	f := p.Task.Runner
	var errs []*policy.FieldError
	if f.Image == "" {
		errs = append(errs, &policy.FieldError{Path: "image", Rule: "is required"})
	}
	switch {
	case p.EvaluationMode == policy.EvaluationFresh && f.EvaluationImage == "":
		errs = append(errs, &policy.FieldError{Path: "evaluation_image", Rule: "is required"})
	case p.EvaluationMode != policy.EvaluationFresh && f.EvaluationImage != "":
		errs = append(errs, &policy.FieldError{Path: "evaluation_image", Rule: "is only used in fresh evaluation mode"})
	}
	if len(f.Run) == 0 {
		errs = append(errs, &policy.FieldError{Path: "run", Rule: "is required: the agent rollout's commands"})
	}
	return errs
}

// NewTaskRun is what the runner executes of a resolved plan (one CheckTask passed).
func NewTaskRun(p *policy.Plan) (TaskRun, error) {
	f := p.Task.Runner
	plan, err := json.Marshal(p)
	if err != nil {
		return TaskRun{}, fmt.Errorf("controller: task %q: plan: %w", p.TaskID, err)
	}
	t := TaskRun{
		ID:                p.TaskID,
		Mode:              p.EvaluationMode,
		Image:             f.Image,
		Policies:          phasePolicies(p),
		Plan:              plan,
		Notice:            p.Notice,
		InjectNotice:      p.InjectNotice,
		Prepare:           f.Prepare,
		Harness:           f.Harness,
		Run:               f.Run,
		Collect:           f.Collect,
		Artifacts:         f.Artifacts,
		Evaluate:          f.Evaluate,
		Retain:            f.Retain,
		Timeouts:          f.Timeouts,
		ProxyStartTimeout: p.ProxyStartTimeout,
		// Declaring artifact paths says they are wanted: saving them is the default.
		SaveArtifacts: len(f.Artifacts) > 0,
	}
	if f.SaveArtifacts != nil {
		t.SaveArtifacts = *f.SaveArtifacts
	}
	if p.EvaluationMode == policy.EvaluationFresh {
		t.EvaluationImage = f.EvaluationImage
	}
	return t, nil
}

func phasePolicies(p *policy.Plan) PhasePolicies {
	pp := PhasePolicies{
		Baseline:   p.Policy(policy.PhaseBaseline),
		Run:        p.Policy(policy.PhaseRun),
		Evaluation: p.Policy(policy.PhaseEvaluation),
	}
	if p.EvaluationMode == policy.EvaluationFresh {
		pp.EvaluationBaseline = p.Policy(policy.PhaseEvaluationBaseline)
	}
	return pp
}
