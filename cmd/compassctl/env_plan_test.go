package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/compass-egress/compass-egress/policy/lifecycle"
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
		{"one plan object of the task", `{"task_id": "t1", "run_network_policy": "no-network"}`, "run", `"no-network"`, ""},
		// One object of plan --json output names its task: another task's policy may be
		// broader than this task's.
		{"one plan object of another task", `{"task_id": "other", "run_network_policy": "public"}`, "run", "", `task_id "other": the plan is another task's than --task "t1"`},
		{"missing phase", `{"run_network_policy": "public"}`, "baseline", "", "no policy for phase"},
		{"invalid policy", `{"run_network_policy": "everything"}`, "run", "", "unknown network mode"},
		// A policy object is not a plan entry because it has a "policy" key: read as one,
		// this no-network policy became public.
		{"policy object with a stray policy key", `{"run_network_policy": {"network_mode": "no-network", "policy": "public"}}`, "run", "", "run_network_policy.policy: unknown key"},
		{"plan entry with a stray key", `{"policies": {"run": {"policy": "public", "allowed_hosts": []}}}`, "run", "", "run_network_policy.policy: unknown key"},
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

// TestOpenBaselineOfRole: an environment opened from a plan without --phase starts under
// its own role's baseline. Fresh mode's evaluation environment opens under
// evaluation_baseline (docs/policy.md §7, fresh step 8), not under the agent's baseline, which may be
// broader.
func TestOpenBaselineOfRole(t *testing.T) {
	plan := writeTemp(t, "plan.json", `{"baseline_network_policy": "public", "evaluation_baseline_network_policy": "no-network"}`)
	tests := []struct {
		role lifecycle.Role
		want string
	}{
		{lifecycle.RoleAgent, `"public"`},
		{lifecycle.RoleEvaluation, `"no-network"`},
	}
	for _, tc := range tests {
		var src policySource
		cmd := &cobra.Command{}
		src.bind(cmd, "")
		if err := cmd.Flags().Set("plan", plan); err != nil {
			t.Fatal(err)
		}
		p, err := src.baseline("t1", tc.role)
		if err != nil {
			t.Fatalf("%s: %v", tc.role, err)
		}
		if p.String() != tc.want {
			t.Errorf("%s environment opens under %s, want %s", tc.role, p, tc.want)
		}
	}
}
