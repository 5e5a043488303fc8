package main

import (
	"fmt"
	"os"

	"github.com/compass-egress/compass-egress/policy"
)

// policyFromPlan reads one phase's effective policy from a plan file (JSON or YAML).
// It accepts the plan as `compassctl plan` writes it and the bare policy fields of a
// task: the phase's policy is looked up as
//
//	<phase>_network_policy: POLICY | {policy: POLICY, ...}
//	policies: {<phase>: POLICY | {policy: POLICY, ...}}
func policyFromPlan(path, phase string) (policy.Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return policy.Policy{}, fmt.Errorf("--plan: %w", err)
	}
	doc, err := policy.DecodeDocument(data)
	if err != nil {
		return policy.Policy{}, fmt.Errorf("--plan %s: %w", path, err)
	}
	obj, ok := doc.(map[string]any)
	if !ok {
		return policy.Policy{}, fmt.Errorf("--plan %s: want an object", path)
	}
	field := phase + "_network_policy"
	raw, ok := obj[field]
	if !ok {
		for _, key := range []string{"policies", "Policies"} {
			if m, isMap := obj[key].(map[string]any); isMap {
				if raw, ok = m[phase]; ok {
					break
				}
			}
		}
	}
	if !ok {
		return policy.Policy{}, fmt.Errorf("--plan %s: no policy for phase %q (looked for %s and policies.%s)", path, phase, field, phase)
	}
	if m, isMap := raw.(map[string]any); isMap {
		for _, key := range []string{"policy", "Policy"} {
			if inner, has := m[key]; has {
				raw = inner
				break
			}
		}
	}
	p, err := policy.ParseValue(raw, field)
	if err != nil {
		return policy.Policy{}, fmt.Errorf("--plan %s: %w", path, err)
	}
	return p, nil
}
