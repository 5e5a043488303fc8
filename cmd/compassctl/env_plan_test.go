package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPolicyFromPlan(t *testing.T) {
	tests := []struct {
		name, doc, phase, want, wantErr string
	}{
		{"field", `{"run_network_policy": "no-network"}`, "run", `"no-network"`, ""},
		{"field with source", `{"run_network_policy": {"policy": {"network_mode": "allowlist", "allowed_hosts": ["a.test"]}, "source": "task"}}`, "run", `{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, ""},
		{"policies map", "policies:\n  evaluation:\n    policy: public\n", "evaluation", `"public"`, ""},
		{"plan --json list", `[{"task_id": "other", "policies": {"run": {"policy": "public"}}}, {"task_id": "t1", "policies": {"run": {"policy": "no-network", "source": "task"}}}]`, "run", `"no-network"`, ""},
		{"plan list without the task", `[{"task_id": "other", "policies": {"run": {"policy": "public"}}}]`, "run", "", `no plan for task "t1" in the list (it has other)`},
		{"missing phase", `{"run_network_policy": "public"}`, "baseline", "", "no policy for phase"},
		{"invalid policy", `{"run_network_policy": "everything"}`, "run", "", "unknown network mode"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "plan")
			if err := os.WriteFile(path, []byte(tc.doc), 0o600); err != nil {
				t.Fatal(err)
			}
			p, err := policyFromPlan(path, "t1", tc.phase)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.String() != tc.want {
				t.Errorf("policy = %s, want %s", p, tc.want)
			}
		})
	}
}

// TestPolicyFromPlanReadsPlanOutput feeds the real `compassctl plan --json` output back
// into --plan, so the two commands cannot drift apart.
func TestPolicyFromPlanReadsPlanOutput(t *testing.T) {
	code, stdout, stderr := runCaptured(t, "plan", "--task", "../../examples/tasks.yaml", "--json")
	if code != 0 {
		t.Fatalf("plan exited %d: %s", code, stderr)
	}
	path := writeTemp(t, "plan.json", stdout)
	p, err := policyFromPlan(path, "swe-2", "run")
	if err != nil {
		t.Fatal(err)
	}
	if p.String() != `"no-network"` {
		t.Errorf("run policy of swe-2 = %s", p)
	}
}
