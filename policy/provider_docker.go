package policy

import (
	"fmt"
	"strings"
)

// checkDockerNetwork refuses a Docker network mode that the egress control cannot
// rewire. With "host" or "container:<id>" the agent shares a network namespace we do not
// own, so nothing can be enforced or switched: only an all-public plan is honest. With
// "none" there is no interface to attach the sidecar to: only an all-no-network plan is.
func checkDockerNetwork(network string, plan *Plan) ErrorList {
	var want Mode
	var why string
	switch {
	case network == "host", strings.HasPrefix(network, "container:"):
		want, why = ModePublic, "shares a network namespace the egress control cannot rewire"
	case network == "none":
		want, why = ModeNoNetwork, "has no interface the egress sidecar could serve"
	default:
		return nil
	}
	var errs ErrorList
	for _, ph := range plan.Phases() {
		if m := plan.Policy(ph).Mode; m != want {
			errs.add(&FieldError{
				Path:  "network",
				Value: Quote(network),
				Rule: fmt.Sprintf("provider docker, %s phase: network %s %s, so dynamic policies are rejected; %s is %s (use a bridge network, or %s in every phase)",
					ph, Clip(network), why, ph.Field(), m, want),
			})
		}
	}
	return errs
}
