package docker

import (
	"fmt"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy"
)

// CheckTask reports what a run of a plan's task on this provider needs that the planner
// does not ask for: the runner's fields (controller.CheckTask), the docker provider, a
// task ID short enough for Docker's names, and the task's own network. A
// policy.Planner's Check, so that every problem is reported before any task starts.
func CheckTask(p *policy.Plan) []*policy.FieldError {
	errs := controller.CheckTask(p)
	if p.Provider != policy.ProviderDocker {
		errs = append(errs, &policy.FieldError{Path: "provider", Rule: fmt.Sprintf("%q: compassctl run drives the docker provider only", p.Provider)})
	}
	// Docker's names are shorter than the planner's IDs: refused here, before any task
	// of the run starts, not when this one opens.
	if err := ValidateTask(p.TaskID); err != nil {
		errs = append(errs, &policy.FieldError{Path: "task_id", Rule: err.Error()})
	}
	// Each task is wired onto its own internal network behind the sidecar; any other
	// network asked for would be silently replaced, so it is refused.
	if p.Network != "" && p.Network != "bridge" {
		errs = append(errs, &policy.FieldError{Path: "network", Rule: fmt.Sprintf("%q: compassctl run puts every task on its own internal bridge network behind the sidecar and cannot honour another network mode; omit network (or use bridge)", p.Network)})
	}
	return errs
}
