package policy

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden plan files in testdata/plans")

// goldenPlan is one planning run whose whole JSON output is kept in
// testdata/plans/<name>.json. Files are repository paths (relative to the module root).
type goldenPlan struct {
	name      string
	tasks     []string
	envParams string
	recipes   []string
	provider  string
	mode      EvaluationMode
}

var goldenPlans = []goldenPlan{
	{name: "examples-tasks", tasks: []string{"examples/tasks.yaml"}},
	{name: "examples-fresh-override", tasks: []string{"examples/task-fresh.json"}, envParams: "examples/env-params.json"},
	{name: "examples-recipe", tasks: []string{"examples/task-recipe.yaml"}, recipes: []string{"examples/recipe-model-endpoint.json"}},
	{name: "examples-daytona", tasks: []string{"examples/task-daytona.yaml"}},
	{name: "examples-modal", tasks: []string{"examples/task-modal.yaml"}},
	{name: "flags-fresh-over-shared", tasks: []string{"examples/tasks.yaml"}, mode: EvaluationFresh},
}

func TestGoldenPlans(t *testing.T) {
	root := filepath.Join("..")
	for _, g := range goldenPlans {
		t.Run(g.name, func(t *testing.T) {
			pl := Planner{Provider: g.provider, EvaluationMode: g.mode}
			if g.envParams != "" {
				data, err := os.ReadFile(filepath.Join(root, g.envParams))
				if err != nil {
					t.Fatal(err)
				}
				if pl.Override, err = ParseEnvParams(data); err != nil {
					t.Fatal(err)
				}
			}
			for _, r := range g.recipes {
				rs, err := LoadRecipes(filepath.Join(root, r))
				if err != nil {
					t.Fatal(err)
				}
				pl.Recipes = append(pl.Recipes, rs...)
			}
			var tasks []Task
			for _, f := range g.tasks {
				ts, err := LoadTasks(filepath.Join(root, f))
				if err != nil {
					t.Fatal(err)
				}
				tasks = append(tasks, ts...)
			}
			plans, err := pl.PlanAll(tasks)
			if err != nil {
				t.Fatal(err)
			}
			got, err := MarshalPlans(plans)
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join("testdata", "plans", g.name+".json")
			if *update {
				if err := os.WriteFile(file, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("%v (run go test ./policy -run TestGoldenPlans -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("plan differs from %s (go test ./policy -run TestGoldenPlans -update rewrites it after review):\n%s", file, got)
			}
		})
	}
}
