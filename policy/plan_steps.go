package policy

import "github.com/compass-egress/compass-egress/policy/lifecycle"

// Step is one lifecycle boundary of docs/policy.md §7 and the policy in force during it.
type Step struct {
	Number      int            `json:"step"`
	Boundary    string         `json:"boundary"`
	Environment lifecycle.Role `json:"environment"`
	// Phase is the policy field in force; Mode is that policy's mode.
	Phase     Phase  `json:"phase"`
	Mode      Mode   `json:"mode"`
	Condition string `json:"condition"`
	// Names are the lifecycle steps the row covers, in the order they run.
	Names []lifecycle.StepName `json:"-"`
}

type stepRow struct {
	boundary    string
	environment lifecycle.Role
	phase       Phase
	condition   string
	names       []lifecycle.StepName
}

// The rows of docs/policy.md §7, common to both modes up to collection.
var agentSteps = []stepRow{
	{"open environment", lifecycle.RoleAgent, PhaseBaseline, "always", []lifecycle.StepName{lifecycle.StepOpen}},
	{"prepare task", lifecycle.RoleAgent, PhaseBaseline, "always", []lifecycle.StepName{lifecycle.StepPrepare}},
	{"start harness session", lifecycle.RoleAgent, PhaseBaseline, "when the task declares a harness", []lifecycle.StepName{lifecycle.StepHarnessStart}},
	{"run task (agent rollout)", lifecycle.RoleAgent, PhaseRun, "always", []lifecycle.StepName{lifecycle.StepRun}},
	{"close harness session", lifecycle.RoleAgent, PhaseRun, "when a harness session was started", []lifecycle.StepName{lifecycle.StepHarnessClose}},
	{"collection commands, then artifact download", lifecycle.RoleAgent, PhaseRun, "commands when declared; download when save_artifacts is true and paths resolve", []lifecycle.StepName{lifecycle.StepCollect, lifecycle.StepDownload}},
}

var sharedSteps = append(append([]stepRow{}, agentSteps...),
	stepRow{"evaluate", lifecycle.RoleAgent, PhaseEvaluation, "always; baseline restored however it ends", []lifecycle.StepName{lifecycle.StepEvaluate}},
	stepRow{"close environment", lifecycle.RoleAgent, PhaseBaseline, "unless retained", []lifecycle.StepName{lifecycle.StepClose}},
)

var freshSteps = append(append([]stepRow{}, agentSteps...),
	stepRow{"close agent environment", lifecycle.RoleAgent, PhaseRun, "unless retained", []lifecycle.StepName{lifecycle.StepClose}},
	stepRow{"open evaluation environment", lifecycle.RoleEvaluation, PhaseEvaluationBaseline, "always", []lifecycle.StepName{lifecycle.StepEvaluationOpen, lifecycle.StepUpload}},
	stepRow{"evaluate", lifecycle.RoleEvaluation, PhaseEvaluation, "always; evaluation baseline restored however it ends", []lifecycle.StepName{lifecycle.StepEvaluate}},
	stepRow{"close evaluation environment", lifecycle.RoleEvaluation, PhaseEvaluationBaseline, "unless retained", []lifecycle.StepName{lifecycle.StepEvaluationEnd}},
)

// Steps lists the plan's lifecycle rows with the mode in force at each.
func Steps(p *Plan) []Step {
	rows := sharedSteps
	if p.EvaluationMode == EvaluationFresh {
		rows = freshSteps
	}
	out := make([]Step, len(rows))
	for i, r := range rows {
		out[i] = Step{
			Number:      i + 1,
			Boundary:    r.boundary,
			Environment: r.environment,
			Phase:       r.phase,
			Mode:        p.Policy(r.phase).Mode,
			Condition:   r.condition,
			Names:       r.names,
		}
	}
	return out
}
