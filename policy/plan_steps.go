package policy

// Environments of a task, as steps name them.
const (
	EnvironmentAgent      = "agent"
	EnvironmentEvaluation = "evaluation"
)

// Step is one lifecycle boundary of docs/policy.md §7 and the policy in force during it.
type Step struct {
	Number      int    `json:"step"`
	Boundary    string `json:"boundary"`
	Environment string `json:"environment"`
	// Phase is the policy field in force; Mode is that policy's mode.
	Phase     Phase  `json:"phase"`
	Mode      Mode   `json:"mode"`
	Condition string `json:"condition"`
}

type stepRow struct {
	boundary, environment string
	phase                 Phase
	condition             string
}

// The rows of docs/policy.md §7, common to both modes up to collection.
var agentSteps = []stepRow{
	{"open environment", EnvironmentAgent, PhaseBaseline, "always"},
	{"prepare task", EnvironmentAgent, PhaseBaseline, "always"},
	{"start harness session", EnvironmentAgent, PhaseBaseline, "when the task declares a harness"},
	{"run task (agent rollout)", EnvironmentAgent, PhaseRun, "always"},
	{"close harness session", EnvironmentAgent, PhaseRun, "when a harness session was started"},
	{"collection commands, then artifact download", EnvironmentAgent, PhaseRun, "commands when declared; download when save_artifacts is true and paths resolve"},
}

var sharedSteps = append(append([]stepRow{}, agentSteps...),
	stepRow{"evaluate", EnvironmentAgent, PhaseEvaluation, "always; baseline restored however it ends"},
	stepRow{"close environment", EnvironmentAgent, PhaseBaseline, "unless retained"},
)

var freshSteps = append(append([]stepRow{}, agentSteps...),
	stepRow{"close agent environment", EnvironmentAgent, PhaseRun, "unless retained"},
	stepRow{"open evaluation environment", EnvironmentEvaluation, PhaseEvaluationBaseline, "always"},
	stepRow{"evaluate", EnvironmentEvaluation, PhaseEvaluation, "always; evaluation baseline restored however it ends"},
	stepRow{"close evaluation environment", EnvironmentEvaluation, PhaseEvaluationBaseline, "unless retained"},
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
		}
	}
	return out
}
