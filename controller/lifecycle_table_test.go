package controller_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/controllertest"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// TestLifecycleFollowsThePlannersTable: the steps the lifecycle takes in each mode, in
// order, with the environment and the policy field in force at each, are the rows of the
// step table the planner prints (`compassctl plan`), whether the optional steps run or
// are skipped. The table and the lifecycle are written apart; this keeps them one.
func TestLifecycleFollowsThePlannersTable(t *testing.T) {
	const policies = "baseline_network_policy: public\n" +
		"run_network_policy: {network_mode: allowlist, allowed_hosts: [model.test]}\n" +
		"evaluation_network_policy: no-network\n"
	const everyStep = "harness: {start: [hs], close: [hc]}\ncollect: [pack]\nartifacts: [/out/result.tar]\n"
	for _, mode := range []string{"shared", "fresh"} {
		for _, optional := range []string{everyStep, ""} {
			t.Run(fmt.Sprintf("%s, optional steps %t", mode, optional != ""), func(t *testing.T) {
				doc := "task_id: t1\nimage: i\nrun: [agent]\nevaluate: [grade]\nevaluation_mode: " + mode + "\n" + policies + optional
				if mode == "fresh" {
					doc += "evaluation_image: g\n"
				}
				p := planOf(t, doc)
				task, err := controller.NewTaskRun(p)
				if err != nil {
					t.Fatal(err)
				}
				r := &controller.Runner{Provider: controllertest.New(), OutDir: t.TempDir()}
				rec, err := r.RunTask(t.Context(), task, nil)
				if err != nil {
					t.Fatal(err)
				}
				if got, want := takenSteps(t, rec), tableSteps(p); !slices.Equal(got, want) {
					t.Errorf("steps taken\n%s\nthe planner's table\n%s", got, want)
				}
				if optional != "" {
					for _, s := range rec.Steps {
						if s.Status != controller.StepOK {
							t.Errorf("step %s %s: every step was to run", s.Name, s.Status)
						}
					}
				}
			})
		}
	}
}

// tableSteps lists the planner's rows as the steps they cover: name, environment,
// policy field and mode.
func tableSteps(p *policy.Plan) []string {
	var out []string
	for _, row := range p.Steps {
		for _, name := range row.Names {
			out = append(out, fmt.Sprintf("%s %s %s %s", name, row.Environment, row.Phase, row.Mode))
		}
	}
	return out
}

// takenSteps lists the steps of a record the same way.
func takenSteps(t *testing.T, rec *controller.Record) []string {
	t.Helper()
	roles := map[string]lifecycle.Role{}
	for _, e := range rec.Environments {
		roles[e.ID] = e.Role
	}
	var out []string
	for _, s := range rec.Steps {
		role, ok := roles[s.Environment]
		if !ok {
			t.Errorf("step %s ran in %q, not an environment of the record", s.Name, s.Environment)
		}
		out = append(out, fmt.Sprintf("%s %s %s %s", s.Name, role, s.Phase, s.Mode))
	}
	return out
}
