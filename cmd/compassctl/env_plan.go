package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/compass-egress/compass-egress/policy"
)

// policyFromPlan reads one phase's effective policy from a plan file (JSON or YAML).
// It accepts the output of `compassctl plan --json` (a list of task plans, of which the
// one whose task_id is task is used) or one task's plan or policy fields: the phase's
// policy is looked up as
//
//	<phase>_network_policy: POLICY | {policy: POLICY, ...}
//	policies: {<phase>: POLICY | {policy: POLICY, ...}}
func policyFromPlan(path, task, phase string) (policy.Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return policy.Policy{}, fmt.Errorf("--plan: %w", err)
	}
	doc, err := policy.DecodeDocument(data)
	if err != nil {
		return policy.Policy{}, fmt.Errorf("--plan %s: %w", path, err)
	}
	if list, isList := doc.([]any); isList {
		if doc, err = planOfTask(list, task); err != nil {
			return policy.Policy{}, fmt.Errorf("--plan %s: %w", path, err)
		}
	}
	obj, ok := doc.(map[string]any)
	if !ok {
		return policy.Policy{}, fmt.Errorf("--plan %s: want a task plan object or a list of them", path)
	}
	if id, named := obj["task_id"]; named && id != task {
		return policy.Policy{}, fmt.Errorf("--plan %s: task_id %s: the plan is another task's than --task %q", path, policy.Display(id), task)
	}
	field := phase + "_network_policy"
	raw, ok := obj[field]
	if !ok {
		if m, isMap := obj["policies"].(map[string]any); isMap {
			raw, ok = m[phase]
		}
	}
	if !ok {
		return policy.Policy{}, fmt.Errorf("--plan %s: no policy for phase %q (looked for %s and policies.%s)", path, phase, field, phase)
	}
	if m, isMap := raw.(map[string]any); isMap && isPlanEntry(m) {
		raw = m["policy"]
	}
	p, err := policy.ParseValue(raw, field)
	if err != nil {
		return policy.Policy{}, fmt.Errorf("--plan %s: %w", path, err)
	}
	return p, nil
}

// isPlanEntry reports whether m is a plan's {policy, source} entry rather than a policy
// object. Only those keys count: a policy object with a stray "policy" key is left for the
// parser to refuse, not read as that key's value (which could be broader).
func isPlanEntry(m map[string]any) bool {
	found := false
	for k := range m {
		switch k {
		case "policy":
			found = true
		case "source":
		default:
			return false
		}
	}
	return found
}

// planOfTask picks the plan whose task_id is task out of a list of plans.
func planOfTask(list []any, task string) (any, error) {
	var ids []string
	for _, item := range list {
		obj, ok := item.(map[string]any)
		if !ok {
			continue
		}
		id, _ := obj["task_id"].(string)
		if id == task {
			return obj, nil
		}
		ids = append(ids, id)
	}
	return nil, fmt.Errorf("no plan for task %q in the list (it has %s)", task, strings.Join(ids, ", "))
}
