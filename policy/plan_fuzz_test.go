package policy

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzPlan feeds arbitrary task, recipe and --env-params documents through the whole
// planner. It must never panic, and every plan it accepts must hold the invariants that
// the runner and the adapters rely on.
func FuzzPlan(f *testing.F) {
	f.Add(`{"task_id":"swe-1","run_network_policy":"no-network"}`, `{"name":"r","run_network_policy":{"network_mode":"allowlist","allowed_hosts":[]},"required_endpoints":[{"host":"model.test","port":443,"phase":"run"}]}`, ``, uint8(0))
	f.Add(`{"task_id":"t","evaluation_mode":"fresh","evaluation_environment":{}}`, `{"name":"b","baseline_network_policy":{"network_mode":"allowlist","allowed_hosts":["198.51.100.7"]}}`, `{"baseline_network_policy":"public"}`, uint8(1))
	f.Add(`[{"task_id":"a","provider":"daytona","run_network_policy":{"network_mode":"allowlist","allowed_hosts":["*.x.test","a.test"]}}]`, `[]`, `{"network":"host"}`, uint8(2))
	f.Add(`{"task_id":"m","provider":"modal","run_network_policy":{"network_mode":"denylist","denied_hosts":["x.test:443"]}}`, `{"name":"m"}`, `{"evaluation_baseline_network_policy":"no-network"}`, uint8(3))
	// Nesting past maxDepth in each document.
	f.Add(`{"task_id":"d","run_network_policy":{"network_mode":"allowlist","allowed_hosts":`+deepJSON("[", "]", maxDepth, `"a.test"`)+`}}`,
		strings.Repeat("- ", maxDepth+1)+"name: r\n", deepJSON(`{"run_network_policy":`, "}", maxDepth+1, `"public"`), uint8(4))
	f.Fuzz(func(t *testing.T, taskDoc, recipeDoc, envDoc string, flags uint8) {
		tv, err := DecodeDocument([]byte(taskDoc))
		if err != nil {
			checkErrorMessage(t, err, maxErrors+1)
			return
		}
		tasks, err := ParseTasks(tv, "task")
		if err != nil {
			checkErrorMessage(t, err, maxErrors+1)
			return
		}
		pl := Planner{}
		if rv, err := DecodeDocument([]byte(recipeDoc)); err == nil {
			if rs, err := ParseRecipes(rv, "recipe"); err == nil {
				pl.Recipes = rs
			} else {
				checkErrorMessage(t, err, maxErrors+1)
			}
		}
		if ep, err := ParseEnvParams([]byte(envDoc)); err == nil {
			pl.Override = ep
		} else {
			checkErrorMessage(t, err, maxErrors+1)
		}
		providers := ProviderNames()
		if flags&0x8 != 0 {
			pl.Provider = providers[int(flags)%len(providers)]
		}
		if flags&0x10 != 0 {
			pl.EvaluationMode = []EvaluationMode{EvaluationShared, EvaluationFresh}[flags>>5&1]
		}
		plans, err := pl.PlanAll(tasks)
		if err != nil {
			// The task that reaches maxErrors problems is reported whole.
			checkErrorMessage(t, err, 2*maxErrors+1)
			return
		}
		if _, err := MarshalPlans(plans); err != nil {
			t.Fatalf("MarshalPlans: %v", err)
		}
		for _, p := range plans {
			checkPlanInvariants(t, pl, p)
		}
	})
}

func checkPlanInvariants(t *testing.T, pl Planner, p *Plan) {
	t.Helper()
	c, ok := LookupProvider(p.Provider)
	if !ok {
		t.Fatalf("plan for unknown provider %q", p.Provider)
	}
	wantPhases, wantSteps := 3, 8
	if p.EvaluationMode == EvaluationFresh {
		wantPhases, wantSteps = 4, 10
	}
	if len(p.Policies) != wantPhases || len(p.Steps) != wantSteps {
		t.Fatalf("%s plan with %d phases and %d steps", p.EvaluationMode, len(p.Policies), len(p.Steps))
	}
	for _, ph := range p.Phases() {
		rp := p.Policies[ph]
		if errs := c.Check(ph, rp.Policy); len(errs) > 0 {
			t.Fatalf("accepted plan breaks the provider's rules: %v", errs)
		}
		// The effective policy is in canonical form: a fixed point of parse∘print.
		var back Policy
		if err := json.Unmarshal([]byte(rp.Policy.String()), &back); err != nil || !back.Equal(rp.Policy) {
			t.Fatalf("%s policy %s does not round-trip: %v", ph, rp.Policy, err)
		}
		if o, ok := pl.Override.Policies[ph]; ok && (rp.Source != SourceOverride || !o.Equal(rp.Policy)) {
			t.Fatalf("%s: override %s lost to %s from %s", ph, o, rp.Policy, rp.Source)
		}
	}
	for _, s := range p.Steps {
		if s.Mode != p.Policy(s.Phase).Mode {
			t.Fatalf("step %d shows %s, policy is %s", s.Number, s.Mode, p.Policy(s.Phase).Mode)
		}
	}
	run := p.Policy(PhaseRun)
	if want := p.InjectNotice && RestrictionNotice(run) != ""; want != (p.Notice != "") {
		t.Fatalf("notice %q for run policy %s (inject %v)", p.Notice, run, p.InjectNotice)
	}
	if (p.Native != nil) != (c.native != nil) {
		t.Fatalf("native options %v for provider %s", p.Native, p.Provider)
	}
}
