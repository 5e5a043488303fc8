# The planner's entry points (compassctl plan and its examples).

.PHONY: demo-plan plan-golden

# Plan every example: the tasks, a fresh task under a run-wide override, a recipe that
# supplies the run allowlist and its model endpoint, and the daytona and modal mappings.
demo-plan: build
	$(BIN)/compassctl plan --task examples/tasks.yaml
	$(BIN)/compassctl plan --task examples/task-fresh.json --env-params @examples/env-params.json
	$(BIN)/compassctl plan --task examples/task-recipe.yaml --recipe examples/recipe-model-endpoint.json
	$(BIN)/compassctl plan --task examples/task-daytona.yaml --task examples/task-modal.yaml

# Rewrite policy/testdata/plans after a deliberate change of plan output; review the diff.
plan-golden:
	$(GO) test ./policy -run '^TestGoldenPlans$$' -count=1 -update
