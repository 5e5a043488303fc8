// Package lifecycle defines a task's lifecycle as the planner and the runner share it:
// the steps, the environments they run in, and the task fields the runner reads
// (commands, harness session, artifacts, timeouts), read from a task file's decoded tree.
// The planner's step table (policy.Steps) names its rows' steps in this vocabulary.
package lifecycle

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
