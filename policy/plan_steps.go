package policy

// Role says which of a task's environments a step runs in.
type Role string

const (
	RoleAgent      Role = "agent"      // the agent's environment (shared mode: also evaluates)
	RoleEvaluation Role = "evaluation" // the separate evaluation environment of fresh mode
)

// StepName names one step of a task's lifecycle, as run records and a task's timeouts
// name it. A row of the lifecycle table covers one or two of them.
type StepName string

const (
	StepOpen         StepName = "open"
	StepPrepare      StepName = "prepare"
	StepHarnessStart StepName = "harness_start"
	StepRun          StepName = "run"
	StepHarnessClose StepName = "harness_close"
	StepCollect      StepName = "collect"
	StepDownload     StepName = "download"
	StepClose        StepName = "close"
	// StepEvaluationOpen opens the fresh evaluation environment; StepUpload then hands it
	// the saved artifacts, under its baseline.
	StepEvaluationOpen StepName = "evaluation_open"
	StepUpload         StepName = "upload_artifacts"
	StepEvaluate       StepName = "evaluate"
	StepEvaluationEnd  StepName = "evaluation_close"
)

// TimeoutSteps are the steps a task file may bound under "timeouts", in the order error
// messages list them. Closes are not among them: a close always runs to its end.
var TimeoutSteps = []StepName{
	StepOpen, StepPrepare, StepHarnessStart, StepRun, StepHarnessClose, StepCollect,
	StepDownload, StepEvaluationOpen, StepUpload, StepEvaluate,
}

// Step is one lifecycle boundary of SPEC §4 and the policy in force during it.
type Step struct {
	Number      int    `json:"step"`
	Boundary    string `json:"boundary"`
	Environment Role   `json:"environment"`
	// Phase is the policy field in force; Mode is that policy's mode.
	Phase     Phase  `json:"phase"`
	Mode      Mode   `json:"mode"`
	Condition string `json:"condition"`
	// Names are the lifecycle steps the row covers, in the order they run.
	Names []StepName `json:"-"`
}

type stepRow struct {
	boundary    string
	environment Role
	phase       Phase
	condition   string
	names       []StepName
}

// The rows of SPEC §4, common to both modes up to collection.
var agentSteps = []stepRow{
	{"open environment", RoleAgent, PhaseBaseline, "always", []StepName{StepOpen}},
	{"prepare task", RoleAgent, PhaseBaseline, "always", []StepName{StepPrepare}},
	{"start harness session", RoleAgent, PhaseBaseline, "when the task declares a harness", []StepName{StepHarnessStart}},
	{"run task (agent rollout)", RoleAgent, PhaseRun, "always", []StepName{StepRun}},
	{"close harness session", RoleAgent, PhaseRun, "when a harness session was started", []StepName{StepHarnessClose}},
	{"collection commands, then artifact download", RoleAgent, PhaseRun, "commands when declared; download when save_artifacts is true and paths resolve", []StepName{StepCollect, StepDownload}},
}

var sharedSteps = append(append([]stepRow{}, agentSteps...),
	stepRow{"evaluate", RoleAgent, PhaseEvaluation, "always; baseline restored however it ends", []StepName{StepEvaluate}},
	stepRow{"close environment", RoleAgent, PhaseBaseline, "unless retained", []StepName{StepClose}},
)

var freshSteps = append(append([]stepRow{}, agentSteps...),
	stepRow{"close agent environment", RoleAgent, PhaseRun, "unless retained", []StepName{StepClose}},
	stepRow{"open evaluation environment", RoleEvaluation, PhaseEvaluationBaseline, "always", []StepName{StepEvaluationOpen, StepUpload}},
	stepRow{"evaluate", RoleEvaluation, PhaseEvaluation, "always; evaluation baseline restored however it ends", []StepName{StepEvaluate}},
	stepRow{"close evaluation environment", RoleEvaluation, PhaseEvaluationBaseline, "unless retained", []StepName{StepEvaluationEnd}},
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
