package policy

import (
	"strings"
	"testing"
)

func planTestTask(t *testing.T, doc string) Task {
	t.Helper()
	v, err := DecodeDocument([]byte(doc))
	if err != nil {
		t.Fatalf("decode task %s: %v", doc, err)
	}
	tasks, err := ParseTasks(v, "task")
	if err != nil {
		t.Fatalf("ParseTasks(%s): %v", doc, err)
	}
	return tasks[0]
}

func planTestRecipes(t *testing.T, docs ...string) []Recipe {
	t.Helper()
	var out []Recipe
	for i, doc := range docs {
		v, err := DecodeDocument([]byte(doc))
		if err != nil {
			t.Fatalf("decode recipe %s: %v", doc, err)
		}
		rs, err := ParseRecipes(v, "recipe"+string(rune('0'+i)))
		if err != nil {
			t.Fatalf("ParseRecipes(%s): %v", doc, err)
		}
		out = append(out, rs...)
	}
	return out
}

func planTestEnv(t *testing.T, doc string) EnvParams {
	t.Helper()
	ep, err := ParseEnvParams([]byte(doc))
	if err != nil {
		t.Fatalf("ParseEnvParams(%s): %v", doc, err)
	}
	return ep
}

// resolved is a phase's expected policy (canonical wire form) and source.
type resolved struct{ policy, source string }

type planCase struct {
	name     string
	task     string
	env      string
	recipes  []string
	provider string
	mode     EvaluationMode
	want     map[Phase]resolved
	wantErr  []string // substrings, each expected in the error
}

func (c planCase) run(t *testing.T) *Plan {
	t.Helper()
	pl := Planner{Recipes: planTestRecipes(t, c.recipes...), Provider: c.provider, EvaluationMode: c.mode}
	if c.env != "" {
		pl.Override = planTestEnv(t, c.env)
	}
	plan, err := pl.Plan(planTestTask(t, c.task))
	if len(c.wantErr) > 0 {
		if err == nil {
			t.Fatalf("planned %s, want an error containing %q", c.task, c.wantErr)
		}
		for _, w := range c.wantErr {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error\n%v\ndoes not contain %q", err, w)
			}
		}
		return nil
	}
	if err != nil {
		t.Fatalf("Plan: %v", err)
	}
	for ph, w := range c.want {
		got, ok := plan.Policies[ph]
		if !ok {
			t.Errorf("%s: missing from the plan", ph)
			continue
		}
		if got.Policy.String() != w.policy || got.Source != w.source {
			t.Errorf("%s = %s from %s, want %s from %s", ph, got.Policy, got.Source, w.policy, w.source)
		}
	}
	if want := len(c.want); want > 0 && len(plan.Policies) != want {
		t.Errorf("plan has %d phases, want %d", len(plan.Policies), want)
	}
	return plan
}

const (
	allowModel = `{"network_mode":"allowlist","allowed_hosts":["model.test:443"]}`
	allowJudge = `{"network_mode":"allowlist","allowed_hosts":["judge.test"]}`
	allowEmpty = `{"network_mode":"allowlist","allowed_hosts":[]}`
)

// docs/policy.md §6: each field on its own, override > task > recipe > default.
func TestPlanPrecedence(t *testing.T) {
	recipeRun := `{"name":"r1","run_network_policy":` + allowJudge + `}`
	tests := []planCase{
		{
			name: "nothing supplies a field: public from default",
			task: `{"task_id":"t"}`,
			want: map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {`"public"`, "default"}, PhaseEvaluation: {`"public"`, "default"}},
		},
		{
			name: "explicit public equals omission when no other source supplies one",
			task: `{"task_id":"t","run_network_policy":"public"}`,
			want: map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {`"public"`, "task"}, PhaseEvaluation: {`"public"`, "default"}},
		},
		{
			name: "task supplies each field on its own",
			task: `{"task_id":"t","run_network_policy":"no-network"}`,
			want: map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {`"no-network"`, "task"}, PhaseEvaluation: {`"public"`, "default"}},
		},
		{
			name: "override beats task, field by field",
			task: `{"task_id":"t","run_network_policy":"no-network","evaluation_network_policy":"no-network"}`,
			env:  `{"run_network_policy":` + allowModel + `}`,
			want: map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {allowModel, "override"}, PhaseEvaluation: {`"no-network"`, "task"}},
		},
		{
			name: "an override of public beats a restrictive task",
			task: `{"task_id":"t","run_network_policy":"no-network"}`,
			env:  `{"run_network_policy":"public"}`,
			want: map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {`"public"`, "override"}, PhaseEvaluation: {`"public"`, "default"}},
		},
		{
			name:    "recipe supplies what the task omits",
			task:    `{"task_id":"t"}`,
			recipes: []string{recipeRun},
			want:    map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {allowJudge, "recipe:r1"}, PhaseEvaluation: {`"public"`, "default"}},
		},
		{
			name:    "task beats recipe",
			task:    `{"task_id":"t","run_network_policy":"no-network"}`,
			recipes: []string{recipeRun},
			want:    map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {`"no-network"`, "task"}, PhaseEvaluation: {`"public"`, "default"}},
		},
		{
			name:    "override beats recipe",
			task:    `{"task_id":"t"}`,
			env:     `{"run_network_policy":"no-network"}`,
			recipes: []string{recipeRun},
			want:    map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {`"no-network"`, "override"}, PhaseEvaluation: {`"public"`, "default"}},
		},
		{
			name:    "two recipes supply a field: the first on the command line wins",
			task:    `{"task_id":"t"}`,
			recipes: []string{`{"name":"a","run_network_policy":"no-network"}`, `{"name":"b","run_network_policy":"public","evaluation_network_policy":"no-network"}`},
			want:    map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {`"no-network"`, "recipe:a"}, PhaseEvaluation: {`"no-network"`, "recipe:b"}},
		},
		{
			name:    "a recipe that does not match the task supplies nothing",
			task:    `{"task_id":"web-1"}`,
			recipes: []string{`{"name":"swe","match":{"task_ids":["swe-*"]},"run_network_policy":"no-network"}`},
			want:    map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {`"public"`, "default"}, PhaseEvaluation: {`"public"`, "default"}},
		},
		{
			name:    "a recipe for another provider supplies nothing",
			task:    `{"task_id":"swe-1","provider":"modal"}`,
			recipes: []string{`{"name":"swe","match":{"providers":["docker"]},"run_network_policy":"no-network"}`},
			want:    map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {`"public"`, "default"}, PhaseEvaluation: {`"public"`, "default"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t) })
	}
}

// docs/policy.md §6: the fresh evaluation Environment's baseline chain.
func TestPlanFreshEvaluationBaseline(t *testing.T) {
	fresh := func(extra string) string { return `{"task_id":"t","evaluation_mode":"fresh"` + extra + `}` }
	recipeBaseline := `{"name":"rb","baseline_network_policy":` + allowJudge + `}`
	recipeVerifier := `{"name":"rv","evaluation_baseline_network_policy":"no-network"}`
	tests := []planCase{
		{
			name: "request-level evaluation baseline first",
			task: fresh(`,"baseline_network_policy":"no-network","evaluation_baseline_network_policy":"no-network"`),
			env:  `{"evaluation_baseline_network_policy":` + allowJudge + `,"baseline_network_policy":"public"}`,
			want: map[Phase]resolved{PhaseBaseline: {`"public"`, "override"}, PhaseRun: {`"public"`, "default"}, PhaseEvaluation: {`"public"`, "default"}, PhaseEvaluationBaseline: {allowJudge, "override"}},
		},
		{
			name: "then the request-level common baseline, before the task's verifier baseline",
			task: fresh(`,"evaluation_baseline_network_policy":"no-network"`),
			env:  `{"baseline_network_policy":` + allowModel + `}`,
			want: map[Phase]resolved{PhaseBaseline: {allowModel, "override"}, PhaseRun: {`"public"`, "default"}, PhaseEvaluation: {`"public"`, "default"}, PhaseEvaluationBaseline: {allowModel, "override"}},
		},
		{
			name: "then the task's verifier baseline, before the agent baseline",
			task: fresh(`,"baseline_network_policy":"no-network","evaluation_baseline_network_policy":` + allowJudge),
			want: map[Phase]resolved{PhaseBaseline: {`"no-network"`, "task"}, PhaseRun: {`"public"`, "default"}, PhaseEvaluation: {`"public"`, "default"}, PhaseEvaluationBaseline: {allowJudge, "task"}},
		},
		{
			name: "the verifier baseline may sit in evaluation_environment",
			task: fresh(`,"baseline_network_policy":"no-network","evaluation_environment":{"baseline_network_policy":` + allowJudge + `}`),
			want: map[Phase]resolved{PhaseBaseline: {`"no-network"`, "task"}, PhaseRun: {`"public"`, "default"}, PhaseEvaluation: {`"public"`, "default"}, PhaseEvaluationBaseline: {allowJudge, "task"}},
		},
		{
			name: "an explicitly empty verifier environment gets public, not the agent's baseline",
			task: fresh(`,"baseline_network_policy":"no-network","evaluation_environment":{}`),
			want: map[Phase]resolved{PhaseBaseline: {`"no-network"`, "task"}, PhaseRun: {`"public"`, "default"}, PhaseEvaluation: {`"public"`, "default"}, PhaseEvaluationBaseline: {`"public"`, "task"}},
		},
		{
			name: "the request-level common baseline beats an empty verifier environment, as it beats the task's verifier baseline",
			task: fresh(`,"evaluation_environment":{}`),
			env:  `{"baseline_network_policy":"no-network"}`,
			want: map[Phase]resolved{PhaseBaseline: {`"no-network"`, "override"}, PhaseRun: {`"public"`, "default"}, PhaseEvaluation: {`"public"`, "default"}, PhaseEvaluationBaseline: {`"no-network"`, "override"}},
		},
		{
			name:    "an empty verifier environment also beats a recipe's verifier baseline",
			task:    fresh(`,"evaluation_environment":{}`),
			recipes: []string{recipeVerifier},
			want:    map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {`"public"`, "default"}, PhaseEvaluation: {`"public"`, "default"}, PhaseEvaluationBaseline: {`"public"`, "task"}},
		},
		{
			name:    "a recipe's verifier baseline before the inherited agent baseline",
			task:    fresh(`,"baseline_network_policy":` + allowModel),
			recipes: []string{recipeVerifier},
			want:    map[Phase]resolved{PhaseBaseline: {allowModel, "task"}, PhaseRun: {`"public"`, "default"}, PhaseEvaluation: {`"public"`, "default"}, PhaseEvaluationBaseline: {`"no-network"`, "recipe:rv"}},
		},
		{
			name: "no verifier baseline anywhere: the agent baseline as resolved, with its source",
			task: fresh(`,"baseline_network_policy":"no-network"`),
			want: map[Phase]resolved{PhaseBaseline: {`"no-network"`, "task"}, PhaseRun: {`"public"`, "default"}, PhaseEvaluation: {`"public"`, "default"}, PhaseEvaluationBaseline: {`"no-network"`, "task"}},
		},
		{
			name:    "the inherited agent baseline may come from a recipe",
			task:    fresh(``),
			recipes: []string{recipeBaseline},
			want:    map[Phase]resolved{PhaseBaseline: {allowJudge, "recipe:rb"}, PhaseRun: {`"public"`, "default"}, PhaseEvaluation: {`"public"`, "default"}, PhaseEvaluationBaseline: {allowJudge, "recipe:rb"}},
		},
		{
			name: "nothing at all: public from default",
			task: fresh(``),
			want: map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {`"public"`, "default"}, PhaseEvaluation: {`"public"`, "default"}, PhaseEvaluationBaseline: {`"public"`, "default"}},
		},
		{
			name:    "request-level evaluation baseline is an error in shared mode",
			task:    `{"task_id":"t","evaluation_mode":"shared"}`,
			env:     `{"evaluation_baseline_network_policy":"public"}`,
			wantErr: []string{`task "t": evaluation_baseline_network_policy "public": an override of the evaluation baseline is only legal in fresh mode`},
		},
		{
			name:    "shared is the default mode, so the override is an error there too",
			task:    `{"task_id":"t"}`,
			env:     `{"evaluation_baseline_network_policy":"no-network"}`,
			wantErr: []string{"only legal in fresh mode"},
		},
		{
			name: "the task's verifier baseline is not part of a shared plan",
			task: `{"task_id":"t","evaluation_baseline_network_policy":"no-network","evaluation_environment":{}}`,
			want: map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {`"public"`, "default"}, PhaseEvaluation: {`"public"`, "default"}},
		},
		{
			name: "--evaluation-mode fresh replaces the task's shared",
			task: `{"task_id":"t","evaluation_mode":"shared","baseline_network_policy":"no-network"}`,
			mode: EvaluationFresh,
			want: map[Phase]resolved{PhaseBaseline: {`"no-network"`, "task"}, PhaseRun: {`"public"`, "default"}, PhaseEvaluation: {`"public"`, "default"}, PhaseEvaluationBaseline: {`"no-network"`, "task"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t) })
	}
}

// docs/policy.md §5: recipes never broaden; required endpoints are checked, and added only to an
// allowlist the recipe itself supplied.
func TestPlanRecipeEndpoints(t *testing.T) {
	modelRecipe := `{"name":"model-endpoint","match":{"task_ids":["swe-*"],"providers":["docker"]},
		"run_network_policy":` + allowEmpty + `,
		"required_endpoints":[{"host":"model.test","port":443,"phase":"run"}]}`
	checkOnly := `{"name":"needs-model","required_endpoints":[{"host":"model.test","port":443,"phase":"run"}]}`
	tests := []planCase{
		{
			name:    "the recipe is the source: its endpoint joins its allowlist",
			task:    `{"task_id":"swe-1"}`,
			recipes: []string{modelRecipe},
			want:    map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {allowModel, "recipe:model-endpoint"}, PhaseEvaluation: {`"public"`, "default"}},
		},
		{
			name:    "an endpoint already allowed by a rule is not added twice",
			task:    `{"task_id":"swe-1"}`,
			recipes: []string{`{"name":"w","run_network_policy":{"network_mode":"allowlist","allowed_hosts":["*.test"]},"required_endpoints":[{"host":"model.test:443","phase":"run"}]}`},
			want:    map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {`{"network_mode":"allowlist","allowed_hosts":["*.test"]}`, "recipe:w"}, PhaseEvaluation: {`"public"`, "default"}},
		},
		{
			name:    "an explicit no-network never turns into an allowlist",
			task:    `{"task_id":"swe-1","run_network_policy":"no-network"}`,
			recipes: []string{modelRecipe},
			wantErr: []string{`task "swe-1": run_network_policy "model.test:443": recipe model-endpoint requires this endpoint in the run phase, but the effective run policy "no-network" (source: task) blocks it (no-network)`},
		},
		{
			name:    "an override allowlist without the endpoint fails, naming endpoint, phase and policy",
			task:    `{"task_id":"swe-1"}`,
			env:     `{"run_network_policy":` + allowJudge + `}`,
			recipes: []string{modelRecipe},
			wantErr: []string{`run_network_policy "model.test:443": recipe model-endpoint requires this endpoint in the run phase, but the effective run policy ` + allowJudge + ` (source: override) blocks it (not-allowlisted)`},
		},
		{
			name:    "an override allowlist with the endpoint passes and stays as given",
			task:    `{"task_id":"swe-1"}`,
			env:     `{"run_network_policy":` + allowModel + `}`,
			recipes: []string{modelRecipe},
			want:    map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {allowModel, "override"}, PhaseEvaluation: {`"public"`, "default"}},
		},
		{
			name:    "the endpoint on another port is blocked",
			task:    `{"task_id":"swe-1","run_network_policy":{"network_mode":"allowlist","allowed_hosts":["model.test:8443"]}}`,
			recipes: []string{checkOnly},
			wantErr: []string{"recipe needs-model requires this endpoint in the run phase"},
		},
		{
			name:    "a denylist that names the endpoint blocks it",
			task:    `{"task_id":"swe-1","run_network_policy":{"network_mode":"denylist","denied_hosts":["*.test"]}}`,
			recipes: []string{checkOnly},
			wantErr: []string{"blocks it (denylisted, rule *.test)"},
		},
		{
			name:    "a recipe's own denylist gets no inferred endpoint: it fails as written",
			task:    `{"task_id":"swe-1"}`,
			recipes: []string{`{"name":"d","run_network_policy":{"network_mode":"denylist","denied_hosts":["*.test"]},"required_endpoints":[{"host":"model.test","port":443,"phase":"run"}]}`},
			wantErr: []string{`the effective run policy {"network_mode":"denylist","denied_hosts":["*.test"]} (source: recipe:d) blocks it (denylisted, rule *.test)`},
		},
		{
			name:    "a recipe that supplies nothing only checks: public passes",
			task:    `{"task_id":"swe-1"}`,
			recipes: []string{checkOnly},
			want:    map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {`"public"`, "default"}, PhaseEvaluation: {`"public"`, "default"}},
		},
		{
			name: "a recipe's endpoints never join another recipe's allowlist",
			task: `{"task_id":"swe-1"}`,
			recipes: []string{
				`{"name":"first","run_network_policy":` + allowJudge + `}`,
				checkOnly,
			},
			wantErr: []string{`recipe needs-model requires this endpoint in the run phase, but the effective run policy ` + allowJudge + ` (source: recipe:first)`},
		},
		{
			name:    "a recipe's endpoints join only the phase they name",
			task:    `{"task_id":"swe-1"}`,
			recipes: []string{`{"name":"r","run_network_policy":` + allowEmpty + `,"evaluation_network_policy":` + allowEmpty + `,"required_endpoints":[{"host":"judge.test","port":443,"phase":"evaluation"}]}`},
			want:    map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {allowEmpty, "recipe:r"}, PhaseEvaluation: {`{"network_mode":"allowlist","allowed_hosts":["judge.test:443"]}`, "recipe:r"}},
		},
		{
			name:    "an address endpoint is checked by IP rules",
			task:    `{"task_id":"swe-1","run_network_policy":{"network_mode":"allowlist","allowed_hosts":["198.51.100.0/24"]}}`,
			recipes: []string{`{"name":"ip","required_endpoints":[{"host":"198.51.100.7","port":443,"phase":"run"}]}`},
			want:    map[Phase]resolved{PhaseBaseline: {`"public"`, "default"}, PhaseRun: {`{"network_mode":"allowlist","allowed_hosts":["198.51.100.0/24"]}`, "task"}, PhaseEvaluation: {`"public"`, "default"}},
		},
		{
			name:    "a name endpoint is not vouched for by an IP rule",
			task:    `{"task_id":"swe-1","run_network_policy":{"network_mode":"allowlist","allowed_hosts":["198.51.100.0/24"]}}`,
			recipes: []string{checkOnly},
			wantErr: []string{"recipe needs-model requires this endpoint"},
		},
		{
			name:    "evaluation-baseline endpoints are not checked in shared mode",
			task:    `{"task_id":"swe-1","baseline_network_policy":"no-network"}`,
			recipes: []string{`{"name":"v","required_endpoints":[{"host":"judge.test","port":443,"phase":"evaluation_baseline"}]}`},
			want:    map[Phase]resolved{PhaseBaseline: {`"no-network"`, "task"}, PhaseRun: {`"public"`, "default"}, PhaseEvaluation: {`"public"`, "default"}},
		},
		{
			name:    "evaluation-baseline endpoints are checked against the inherited baseline in fresh mode",
			task:    `{"task_id":"swe-1","evaluation_mode":"fresh","baseline_network_policy":"no-network"}`,
			recipes: []string{`{"name":"v","required_endpoints":[{"host":"judge.test","port":443,"phase":"evaluation_baseline"}]}`},
			wantErr: []string{`evaluation_baseline_network_policy "judge.test:443": recipe v requires this endpoint in the evaluation_baseline phase, but the effective evaluation_baseline policy "no-network" (source: task)`},
		},
		{
			name:    "a recipe that supplied the agent baseline adds its verifier-baseline endpoints to the inherited copy",
			task:    `{"task_id":"swe-1","evaluation_mode":"fresh"}`,
			recipes: []string{`{"name":"b","baseline_network_policy":` + allowEmpty + `,"required_endpoints":[{"host":"packages.test","port":443,"phase":"baseline"},{"host":"judge.test","port":443,"phase":"evaluation_baseline"}]}`},
			want: map[Phase]resolved{
				PhaseBaseline:           {`{"network_mode":"allowlist","allowed_hosts":["packages.test:443"]}`, "recipe:b"},
				PhaseRun:                {`"public"`, "default"},
				PhaseEvaluation:         {`"public"`, "default"},
				PhaseEvaluationBaseline: {`{"network_mode":"allowlist","allowed_hosts":["packages.test:443","judge.test:443"]}`, "recipe:b"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t) })
	}
}

func TestPlanAppliedRecipes(t *testing.T) {
	recipes := []string{
		`{"name":"all"}`,
		`{"name":"swe","match":{"task_ids":["swe-*","bug-?"]}}`,
		`{"name":"docker-only","match":{"providers":["docker"]}}`,
		`{"name":"web","match":{"task_ids":["web-*"]}}`,
	}
	tests := []struct {
		task, provider string
		want           []string
	}{
		{`{"task_id":"swe-1"}`, "", []string{"all", "swe", "docker-only"}},
		{`{"task_id":"bug-7","provider":"modal"}`, "", []string{"all", "swe"}},
		{`{"task_id":"bug-77"}`, "", []string{"all", "docker-only"}},
		{`{"task_id":"web-1","provider":"docker"}`, "daytona", []string{"all", "web"}},
	}
	for _, tt := range tests {
		pl := Planner{Recipes: planTestRecipes(t, recipes...), Provider: tt.provider}
		plan, err := pl.Plan(planTestTask(t, tt.task))
		if err != nil {
			t.Fatalf("Plan(%s): %v", tt.task, err)
		}
		if strings.Join(plan.AppliedRecipes, ",") != strings.Join(tt.want, ",") {
			t.Errorf("Plan(%s).AppliedRecipes = %q, want %q", tt.task, plan.AppliedRecipes, tt.want)
		}
	}
}

func TestPlanProviderAndModeDefaultsAndFlags(t *testing.T) {
	tests := []struct {
		task, provider string
		mode           EvaluationMode
		wantProvider   string
		wantMode       EvaluationMode
	}{
		{`{"task_id":"t"}`, "", "", "docker", "shared"},
		{`{"task_id":"t","provider":"modal","evaluation_mode":"fresh"}`, "", "", "modal", "fresh"},
		{`{"task_id":"t","provider":"modal","evaluation_mode":"fresh"}`, "daytona", "shared", "daytona", "shared"},
		{`{"task_id":"t"}`, "host_process", "fresh", "host_process", "fresh"},
	}
	for _, tt := range tests {
		pl := Planner{Provider: tt.provider, EvaluationMode: tt.mode}
		plan, err := pl.Plan(planTestTask(t, tt.task))
		if err != nil {
			t.Fatalf("Plan(%s): %v", tt.task, err)
		}
		if plan.Provider != tt.wantProvider || plan.EvaluationMode != tt.wantMode {
			t.Errorf("Plan(%s) with flags %q/%q: provider %s mode %s, want %s %s", tt.task, tt.provider, tt.mode, plan.Provider, plan.EvaluationMode, tt.wantProvider, tt.wantMode)
		}
	}
}

func TestPlannerValidate(t *testing.T) {
	tests := []struct {
		name    string
		pl      Planner
		wantErr string
	}{
		{"zero value", Planner{}, ""},
		{"unknown provider", Planner{Provider: "kubernetes"}, `provider "kubernetes": unknown provider; use one of host_process, docker, daytona, modal`},
		{"unknown mode", Planner{EvaluationMode: "reuse"}, `evaluation-mode "reuse": unknown evaluation mode; use shared or fresh`},
		{"duplicate recipe names", Planner{Recipes: []Recipe{{Name: "a", Origin: "x.json"}, {Name: "a", Origin: "y.json"}}}, `recipe "a": is defined twice (x.json and y.json); recipe names must be unique`},
	}
	for _, tt := range tests {
		err := tt.pl.Validate()
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.wantErr != "" && (err == nil || err.Error() != tt.wantErr):
			t.Errorf("%s: error %v, want %s", tt.name, err, tt.wantErr)
		}
	}
}

func TestPlanRefusesUnknownProviderOrModeBuiltInCode(t *testing.T) {
	for _, pl := range []Planner{{Provider: "k8s"}, {EvaluationMode: "reuse"}} {
		_, err := pl.Plan(Task{ID: "t"})
		if err == nil || !strings.HasPrefix(err.Error(), `task "t": cannot plan provider`) {
			t.Errorf("Planner %+v: error %v", pl, err)
		}
	}
	if _, err := (&Planner{}).Plan(Task{ID: "t", Provider: "k8s"}); err == nil {
		t.Error("planned a task for an unknown provider")
	}
}

func TestPlanAllReportsEveryTask(t *testing.T) {
	pl := Planner{Provider: ProviderHostProcess}
	_, err := pl.PlanAll([]Task{
		planTestTask(t, `{"task_id":"a","run_network_policy":"no-network"}`),
		planTestTask(t, `{"task_id":"b"}`),
		planTestTask(t, `{"task_id":"c","evaluation_network_policy":"no-network"}`),
	})
	if err == nil {
		t.Fatal("PlanAll planned tasks host_process cannot enforce")
	}
	for _, w := range []string{`task "a": run_network_policy`, `task "c": evaluation_network_policy`} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error\n%v\ndoes not contain %q", err, w)
		}
	}
	if strings.Contains(err.Error(), `task "b"`) {
		t.Errorf("error names task b, which is valid:\n%v", err)
	}
}

func TestPlanNotice(t *testing.T) {
	tests := []struct {
		name, task string
		recipes    []string
		want       string
		inject     bool
	}{
		{"public run: none", `{"task_id":"t","baseline_network_policy":"no-network"}`, nil, "", true},
		{"no-network run", `{"task_id":"t","run_network_policy":"no-network"}`, nil, referenceNoNetwork, true},
		{"turned off: none, enforcement unchanged", `{"task_id":"t","run_network_policy":"no-network","inject_network_restriction_notice":false}`, nil, "", false},
		{"turned on explicitly", `{"task_id":"t","run_network_policy":"no-network","inject_network_restriction_notice":true}`, nil, referenceNoNetwork, true},
		{
			"recipe-added targets appear in the statement",
			`{"task_id":"t"}`,
			[]string{`{"name":"r","run_network_policy":{"network_mode":"allowlist","allowed_hosts":["pypi.org"]},"required_endpoints":[{"host":"registry.npmjs.org","port":443,"phase":"run"}]}`},
			referenceAllowlist, true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pl := Planner{Recipes: planTestRecipes(t, tt.recipes...)}
			plan, err := pl.Plan(planTestTask(t, tt.task))
			if err != nil {
				t.Fatal(err)
			}
			if plan.Notice != tt.want || plan.InjectNotice != tt.inject {
				t.Errorf("notice %q (inject %v), want %q (inject %v)", plan.Notice, plan.InjectNotice, tt.want, tt.inject)
			}
			if tt.name == "turned off: none, enforcement unchanged" && plan.Policy(PhaseRun).Mode != ModeNoNetwork {
				t.Errorf("turning the notice off changed the run policy to %s", plan.Policy(PhaseRun))
			}
		})
	}
}

// A provider's refusal of an entry a recipe added says so: the policy's author never
// wrote it. One the author wrote is refused without that note.
func TestPlanRefusalNamesTheRecipeThatAddedAnEntry(t *testing.T) {
	recipe := `{"name":"model-endpoint","run_network_policy":{"network_mode":"allowlist","allowed_hosts":["judge.test:80"]},
		"required_endpoints":[{"host":"model.test","port":443,"phase":"run"}]}`
	for _, tc := range []struct {
		name, task, want string
		added            bool
	}{
		{"added by the recipe", `{"task_id":"t1"}`,
			`run_network_policy.allowed_hosts[1] "model.test:443": provider daytona, run phase: port-specific targets cannot be enforced; write the host without a port (recipe "model-endpoint" added this entry, an endpoint it requires; an entry of the policy's source, recipe:model-endpoint, that allows the endpoint makes the addition unneeded)`, true},
		// The recipe's own entry, which it wrote: the line ends without the note.
		{"written in the recipe", `{"task_id":"t1"}`,
			`run_network_policy.allowed_hosts[0] "judge.test:80": provider daytona, run phase: port-specific targets cannot be enforced; write the host without a port` + "\n", true},
		{"written in the task", `{"task_id":"t1","run_network_policy":` + allowModel + `}`,
			`run_network_policy.allowed_hosts[0] "model.test:443": provider daytona, run phase: port-specific targets cannot be enforced; write the host without a port`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl := Planner{Recipes: planTestRecipes(t, recipe), Provider: ProviderDaytona}
			_, err := pl.Plan(planTestTask(t, tc.task))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error\n%v\nwant it to contain\n%s", err, tc.want)
			}
			if !tc.added && strings.Contains(err.Error(), "added this entry") {
				t.Errorf("an entry the task wrote is said to be a recipe's: %v", err)
			}
		})
	}
}
