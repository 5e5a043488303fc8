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
		{"missing phase", `{"run_network_policy": "public"}`, "baseline", "", "no policy for phase"},
		{"invalid policy", `{"run_network_policy": "everything"}`, "run", "", "unknown network mode"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "plan")
			if err := os.WriteFile(path, []byte(tc.doc), 0o600); err != nil {
				t.Fatal(err)
			}
			p, err := policyFromPlan(path, tc.phase)
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
