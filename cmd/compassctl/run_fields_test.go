package main

import (
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/policy"
)

// TestTaskRunOfDefaultsAndPolicies: each phase's effective policy reaches its phase
// (fresh mode's evaluation baseline included), retain defaults to false, and
// save_artifacts to whether artifacts are declared (docs/run.md).
func TestTaskRunOfDefaultsAndPolicies(t *testing.T) {
	const policies = "baseline_network_policy: public\n" +
		"run_network_policy: {network_mode: allowlist, allowed_hosts: [model.test]}\n" +
		"evaluation_network_policy: {network_mode: allowlist, allowed_hosts: [judge.test]}\n"
	tests := []struct {
		name, doc            string
		retain, save         bool
		evaluationBaseline   string
		baseline, run, evalu string
	}{
		{"shared, no artifacts", "task_id: a\nimage: i\nrun: [x]\ntimeouts: {open: 90, run: 1.5}\n" + policies, false, false, "",
			`"public"`, `{"network_mode":"allowlist","allowed_hosts":["model.test"]}`, `{"network_mode":"allowlist","allowed_hosts":["judge.test"]}`},
		{"fresh, artifacts, retained", "task_id: a\nimage: i\nrun: [x]\nevaluation_mode: fresh\nevaluation_image: g\nartifacts: [/out/r]\nretain: true\n" +
			policies + "evaluation_baseline_network_policy: no-network\n", true, true, `"no-network"`,
			`"public"`, `{"network_mode":"allowlist","allowed_hosts":["model.test"]}`, `{"network_mode":"allowlist","allowed_hosts":["judge.test"]}`},
		{"artifacts not saved", "task_id: a\nimage: i\nrun: [x]\nartifacts: [/out/r]\nsave_artifacts: false\n" + policies, false, false, "",
			`"public"`, `{"network_mode":"allowlist","allowed_hosts":["model.test"]}`, `{"network_mode":"allowlist","allowed_hosts":["judge.test"]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := planOf(t, tc.doc)
			p.ProxyStartTimeout = 45 * time.Second // an env-params setting
			tr, err := taskRunOf(p)
			if err != nil {
				t.Fatal(err)
			}
			if tr.Retain != tc.retain || tr.SaveArtifacts != tc.save {
				t.Errorf("retain %t save_artifacts %t; want %t %t", tr.Retain, tr.SaveArtifacts, tc.retain, tc.save)
			}
			if tc.name == "shared, no artifacts" {
				// A number of seconds keeps its fraction; open is a step a timeout bounds.
				if tr.Timeouts[policy.StepRun] != 1500*time.Millisecond || tr.Timeouts[policy.StepOpen] != 90*time.Second || tr.ProxyStartTimeout != 45*time.Second {
					t.Errorf("timeouts %v, proxy start timeout %s; want run 1.5s, open 90s, 45s", tr.Timeouts, tr.ProxyStartTimeout)
				}
			}
			pp := tr.Policies
			evalBase := ""
			if pp.EvaluationBaseline.Mode.Valid() {
				evalBase = pp.EvaluationBaseline.String()
			}
			for _, c := range []struct{ phase, got, want string }{
				{"baseline", pp.Baseline.String(), tc.baseline},
				{"run", pp.Run.String(), tc.run},
				{"evaluation", pp.Evaluation.String(), tc.evalu},
				{"evaluation_baseline", evalBase, tc.evaluationBaseline},
			} {
				if c.got != c.want {
					t.Errorf("%s policy %s, want %s", c.phase, c.got, c.want)
				}
			}
		})
	}
}
