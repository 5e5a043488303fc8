package policy

import "github.com/compass-egress/compass-egress/policy/lifecycle"

// RunnerKeys are the task fields the lifecycle runner interprets.
var RunnerKeys = []string{
	"image", "evaluation_image", "prepare", "harness", "run", "collect", "artifacts",
	"save_artifacts", "evaluate", "retain", "timeouts",
}

// parseRunnerFields reads the runner's fields of the task at path (lifecycle.Parse),
// adding their problems to errs.
func parseRunnerFields(obj map[string]any, path string, errs *ErrorList) lifecycle.Fields {
	f, problems := lifecycle.Parse(obj)
	for _, p := range problems {
		fe := &FieldError{Path: joinPath(path, Clip(p.Field)), Rule: p.Rule}
		if p.Shown {
			fe.Value = display(p.Value)
		}
		errs.add(fe)
	}
	return f
}
