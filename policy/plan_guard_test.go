package policy_test

import (
	"strings"
	"testing"

	"github.com/compass-egress/compass-egress/net/addrguard"
	"github.com/compass-egress/compass-egress/policy"
)

// TestPlannedAddressEndpointsPassTheGuard: planning checks a recipe's required address
// endpoints as the sidecar will treat them, internal-address guard included (docs/policy.md
// §5, docs/proxy.md). "0.0.0.0/0" allows 127.0.0.1:8080 to the matcher, but the guard refuses it
// unless a rule inside 127.0.0.0/8 allows it, and under a denylist always. So a recipe
// adds such an endpoint to the allowlist it supplies (the entry lifts the guard), and a
// policy from elsewhere that cannot reach it fails the plan, naming the guard. Every
// plan that passes is checked against the sidecar's own guard.
func TestPlannedAddressEndpointsPassTheGuard(t *testing.T) {
	recipes := parseRecipes(t, `{"name": "local-model",
	 "run_network_policy": {"network_mode": "allowlist", "allowed_hosts": ["0.0.0.0/0"]},
	 "required_endpoints": [{"host": "127.0.0.1", "port": 8080, "phase": "run"},
	                        {"host": "169.254.169.254", "port": 80, "phase": "run"}]}`)
	guard := addrguard.New(addrguard.Config{})
	for _, tc := range []struct {
		task    string
		refused string // "" when the plan passes
	}{
		{`{"task_id": "recipe-supplied"}`, ""},
		{`{"task_id": "task-supplied", "run_network_policy": {"network_mode": "allowlist", "allowed_hosts": ["0.0.0.0/0"]}}`,
			"(internal-address: the sidecar refuses loopback addresses unless an allowlist IP or CIDR rule within 127.0.0.0/8 allows them)"},
		{`{"task_id": "lifted", "run_network_policy": {"network_mode": "allowlist", "allowed_hosts": ["127.0.0.0/8", "169.254.169.254"]}}`, ""},
		{`{"task_id": "denylist", "run_network_policy": {"network_mode": "denylist", "denied_hosts": []}}`,
			"(internal-address: the sidecar refuses link-local addresses unless an allowlist IP or CIDR rule within 169.254.0.0/16 allows them)"},
	} {
		tasks := parseTasks(t, tc.task)
		plan, err := (&policy.Planner{Recipes: recipes}).Plan(tasks[0])
		if tc.refused != "" {
			if err == nil || !strings.Contains(err.Error(), tc.refused) {
				t.Errorf("task %s: plan error %v, want one containing %q", tasks[0].ID, err, tc.refused)
			}
			continue
		}
		if err != nil {
			t.Errorf("task %s: %v", tasks[0].ID, err)
			continue
		}
		run := plan.Policy(policy.PhaseRun)
		m := policy.Compile(run)
		for _, e := range recipes[0].Required {
			a, port := e.Target.Prefix.Addr(), e.Target.Port
			if !m.Decide("", a, port).Allowed || guard.Refuses(m, a, port) {
				t.Errorf("task %s: planned run policy %s passed the check of required endpoint %s, which the sidecar refuses", tasks[0].ID, run, e.Target)
			}
		}
	}
}

func parseRecipes(t *testing.T, doc string) []policy.Recipe {
	t.Helper()
	v, err := policy.DecodeDocument([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	recipes, err := policy.ParseRecipes(v, "r.json")
	if err != nil {
		t.Fatal(err)
	}
	return recipes
}

func parseTasks(t *testing.T, doc string) []policy.Task {
	t.Helper()
	v, err := policy.DecodeDocument([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := policy.ParseTasks(v, "t.json")
	if err != nil {
		t.Fatal(err)
	}
	return tasks
}
