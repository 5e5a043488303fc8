package policy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

func TestParseTasksAccepts(t *testing.T) {
	doc := `
- task_id: swe-1
  provider: docker
  evaluation_mode: fresh
  baseline_network_policy: public
  run_network_policy: {network_mode: allowlist, allowed_hosts: ["model.test:443"]}
  evaluation_network_policy: no-network
  evaluation_baseline_network_policy: public
  evaluation_environment: {}
  inject_network_restriction_notice: false
  image: compass-demo-agent:latest
  evaluation_image: compass-demo-grader:latest
  prepare: ["fetch http://packages.test/tool.tar"]
  harness: {start: ["start"], close: ["stop"]}
  run: ["agent --task /task"]
  collect: ["tar -cf /out/result.tar /work"]
  artifacts: ["/out/result.tar"]
  save_artifacts: true
  evaluate: ["grade /out/result.tar"]
  retain: false
  timeouts: {prepare: 10m, run: 30m, evaluate: 10m}
- task_id: swe-2
`
	v, err := DecodeDocument([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := ParseTasks(v, "tasks.yaml")
	if err != nil {
		t.Fatalf("ParseTasks: %v", err)
	}
	if len(tasks) != 2 {
		t.Fatalf("%d tasks, want 2", len(tasks))
	}
	a := tasks[0]
	if a.ID != "swe-1" || a.Provider != "docker" || a.EvaluationMode != EvaluationFresh || !a.EvaluationEnvironment || a.InjectNotice == nil || *a.InjectNotice || a.Origin != "tasks.yaml[0]" {
		t.Errorf("task fields: %+v", a)
	}
	if len(a.Policies) != 4 || a.Policies[PhaseRun].String() != allowModel {
		t.Errorf("policies: %v", a.Policies)
	}
	yes, halfHour := true, 30*time.Minute
	wantRunner := lifecycle.Fields{
		Image: "compass-demo-agent:latest", EvaluationImage: "compass-demo-grader:latest",
		Prepare: []lifecycle.Command{{"fetch", "http://packages.test/tool.tar"}},
		Harness: &lifecycle.HarnessSession{Start: []lifecycle.Command{{"start"}}, Close: []lifecycle.Command{{"stop"}}},
		Run:     []lifecycle.Command{{"agent", "--task", "/task"}}, Collect: []lifecycle.Command{{"tar", "-cf", "/out/result.tar", "/work"}},
		Artifacts: []string{"/out/result.tar"}, SaveArtifacts: &yes, Evaluate: []lifecycle.Command{{"grade", "/out/result.tar"}},
		Timeouts: map[lifecycle.StepName]time.Duration{lifecycle.StepPrepare: 10 * time.Minute, lifecycle.StepRun: halfHour, lifecycle.StepEvaluate: 10 * time.Minute},
	}
	if !reflect.DeepEqual(a.Runner, wantRunner) {
		t.Errorf("runner fields\n%#v\nwant\n%#v", a.Runner, wantRunner)
	}
	b := tasks[1]
	if b.ID != "swe-2" || b.Provider != "" || b.EvaluationMode != "" || b.Policies != nil || b.EvaluationEnvironment || b.InjectNotice != nil || !reflect.DeepEqual(b.Runner, lifecycle.Fields{}) {
		t.Errorf("a bare task must leave every field unset: %+v", b)
	}
}

func TestParseTasksRefuses(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"unknown key lists the known ones", `{"task_id":"t","run_policy":"public"}`,
			"run_policy: unknown key; a task takes only task_id, provider, evaluation_mode, baseline_network_policy, run_network_policy, evaluation_network_policy, evaluation_baseline_network_policy, evaluation_environment, inject_network_restriction_notice, image, evaluation_image, prepare, harness, run, collect, artifacts, save_artifacts, evaluate, retain, timeouts"},
		{"missing task_id", `{"provider":"docker"}`, "task_id: is required"},
		{"bad task_id", `{"task_id":"a b"}`, `task_id "a b": must be 1-64 characters of letters, digits, '.', '_' and '-', starting with a letter or digit`},
		{"task_id not a string", `{"task_id":7}`, `task_id 7: must be 1-64 characters`},
		{"unknown provider", `{"task_id":"t","provider":"k8s"}`, `provider "k8s": unknown provider; use one of host_process, docker, daytona, modal`},
		{"unknown mode", `{"task_id":"t","evaluation_mode":"reuse"}`, `evaluation_mode "reuse": unknown evaluation mode; use shared or fresh`},
		{"policy error names the field path", `{"task_id":"t","run_network_policy":{"network_mode":"allowlist","allowed_hosts":["a.test","b.test","https://x"]}}`,
			`run_network_policy.allowed_hosts[2] "https://x": a URL scheme is not allowed`},
		{"list paths carry the index", `[{"task_id":"a"},{"task_id":"b","run_network_policy":"allow"}]`, `[1].run_network_policy "allow": unknown network mode`},
		{"provider-native knob", `{"task_id":"t","run_network_policy":{"network_mode":"allowlist","allowed_hosts":[],"networkBlockAll":true}}`, "run_network_policy.networkBlockAll: networkBlockAll is a provider-native (daytona) option"},
		{"evaluation_environment must be an object", `{"task_id":"t","evaluation_environment":null}`, `evaluation_environment null: must be an object ({} declares an evaluation environment with its own public baseline), not null`},
		{"evaluation_environment unknown key", `{"task_id":"t","evaluation_environment":{"image":"x"}}`, "evaluation_environment.image: unknown key; evaluation_environment takes only baseline_network_policy"},
		{"verifier baseline given twice", `{"task_id":"t","evaluation_baseline_network_policy":"public","evaluation_environment":{"baseline_network_policy":"public"}}`,
			"evaluation_environment.baseline_network_policy: the task also sets evaluation_baseline_network_policy; give the verifier baseline once"},
		{"notice switch must be a boolean", `{"task_id":"t","inject_network_restriction_notice":"no"}`, `inject_network_restriction_notice "no": must be true or false, not a string`},
		{"duplicate task IDs", `[{"task_id":"a"},{"task_id":"a"}]`, `task_id "a": appears twice (f[0] and f[1]); task IDs must be unique`},
		{"empty list", `[]`, "the task list is empty"},
		{"not a task", `"swe-1"`, `"swe-1": a task file holds a task object or a list of task objects, not a string`},
		{"list item not a task", `[1]`, `[0] 1: a task is an object, not a number`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := DecodeDocument([]byte(tt.doc))
			if err != nil {
				t.Fatal(err)
			}
			_, err = ParseTasks(v, "f")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ParseTasks(%s) error\n%v\nwant it to contain\n%s", tt.doc, err, tt.want)
			}
		})
	}
}

func TestLoadTasksPrefixesTheFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tasks.json")
	if err := os.WriteFile(file, []byte(`{"task_id":"t","run_network_policy":"allowlist","bogus":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadTasks(file)
	want := file + `: bogus: unknown key; a task takes only`
	if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "\n"+file+`: run_network_policy "allowlist": allowlist needs the object form`) {
		t.Errorf("LoadTasks error\n%v\nwant every line prefixed with the file", err)
	}
	multi := filepath.Join(dir, "tasks.yaml")
	if err := os.WriteFile(multi, []byte("task_id: a\n---\ntask_id: b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTasks(multi); err == nil || err.Error() != multi+": invalid YAML: the file holds more than one document; put several entries in one list" {
		t.Errorf("a second YAML document must be refused, not dropped: %v", err)
	}
	if _, err := LoadRecipes(multi); err == nil || !strings.Contains(err.Error(), "more than one document") {
		t.Errorf("LoadRecipes of two YAML documents: %v", err)
	}
	if _, err := LoadTasks(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("LoadTasks of a missing file succeeded")
	}
	if err := os.WriteFile(file, []byte(`{"task_id":"t","task_id":"u"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTasks(file); err == nil || !strings.Contains(err.Error(), "appears twice") {
		t.Errorf("duplicate JSON key: %v", err)
	}
}

func TestParseEnvParams(t *testing.T) {
	ep, err := ParseEnvParams([]byte(`{"run_network_policy":"no-network","network":"container:abc","allowlist_proxy_start_timeout":2.5}`))
	if err != nil {
		t.Fatal(err)
	}
	if ep.Policies[PhaseRun].Mode != ModeNoNetwork || ep.Network != "container:abc" || ep.ProxyStartTimeout.Milliseconds() != 2500 || len(ep.Policies) != 1 {
		t.Errorf("parsed %+v", ep)
	}
	if ep, err := ParseEnvParams([]byte("  ")); err != nil || ep.Policies != nil {
		t.Errorf("empty env params: %+v, %v", ep, err)
	}
	tests := []struct{ doc, want string }{
		{`{"runpolicy":"public"}`, "runpolicy: unknown key; --env-params takes only baseline_network_policy, run_network_policy, evaluation_network_policy, evaluation_baseline_network_policy, network, allowlist_proxy_start_timeout"},
		{`["public"]`, `["public"]: the env params are a JSON object, not a list`},
		{`{"network":""}`, `network "": must be a non-empty Docker network name or mode without whitespace`},
		{`{"network":"container:"}`, `network "container:": container: needs a container ID or name`},
		{`{"network":1}`, `network 1: must be a string naming a Docker network mode, not a number`},
		{`{"allowlist_proxy_start_timeout":0}`, "allowlist_proxy_start_timeout 0: must be a positive number of seconds"},
		{`{"allowlist_proxy_start_timeout":-3}`, "allowlist_proxy_start_timeout -3: must be a positive number of seconds"},
		{`{"allowlist_proxy_start_timeout":"30"}`, `allowlist_proxy_start_timeout "30": must be a number of seconds, not a string`},
		{`{"allowlist_proxy_start_timeout":3601}`, "allowlist_proxy_start_timeout 3601: must be at most 3600 seconds"},
		{`{"allowlist_proxy_start_timeout":1e-9}`, "allowlist_proxy_start_timeout 1e-9: must be at least 0.001 seconds"},
		{`{"evaluation_network_policy":{"network_mode":"allowlist"}}`, "evaluation_network_policy.allowed_hosts: is required for an allowlist policy"},
		{`{"run_network_policy":"public","run_network_policy":"no-network"}`, `the key "run_network_policy" appears twice`},
		{`{"run_network_policy":"public"} x`, "invalid JSON"},
	}
	for _, tt := range tests {
		_, err := ParseEnvParams([]byte(tt.doc))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseEnvParams(%s) error\n%v\nwant it to contain\n%s", tt.doc, err, tt.want)
		}
	}
}

func TestParseRecipes(t *testing.T) {
	v, err := DecodeDocument([]byte(`
name: model-endpoint
match: {task_ids: ["swe-*"], providers: [docker, modal]}
run_network_policy: {network_mode: allowlist, allowed_hosts: []}
required_endpoints:
  - {host: model.test, port: 443, phase: run}
  - {host: "judge.test:8443", phase: evaluation}
  - {host: "2001:db8::1", port: 443, phase: evaluation_baseline}
`))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := ParseRecipes(v, "r.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	var eps []string
	for _, e := range r.Required {
		eps = append(eps, string(e.Phase)+"="+e.Target.String())
	}
	if r.Name != "model-endpoint" || strings.Join(r.TaskIDs, ",") != "swe-*" || strings.Join(r.Providers, ",") != "docker,modal" ||
		r.Policies[PhaseRun].String() != allowEmpty || strings.Join(eps, " ") != "run=model.test:443 evaluation=judge.test:8443 evaluation_baseline=[2001:db8::1]:443" {
		t.Errorf("parsed %+v (endpoints %v)", r, eps)
	}

	tests := []struct{ doc, want string }{
		{`{"match":{}}`, "name: is required"},
		{`{"name":"Model Endpoint"}`, `name "Model Endpoint": must be 1-64 characters of lower-case letters, digits, '.', '_' and '-'`},
		{`{"name":"r","matches":{}}`, "matches: unknown key; a recipe takes only name, match, baseline_network_policy, run_network_policy, evaluation_network_policy, evaluation_baseline_network_policy, required_endpoints"},
		{`{"name":"r","match":{"task_id":["x"]}}`, "match.task_id: unknown key; match takes only task_ids, providers"},
		{`{"name":"r","match":{"task_ids":["[x"]}}`, `match.task_ids[0] "[x": is not a valid glob pattern`},
		{`{"name":"r","match":{"providers":["k8s"]}}`, `match.providers[0] "k8s": unknown provider`},
		{`{"name":"r","match":{"providers":"docker"}}`, `match.providers "docker": must be a list of strings, not a string`},
		{`{"name":"r","required_endpoints":[{"host":"model.test","phase":"run"}]}`, "required_endpoints[0].port: is required: an endpoint is checked on the port the harness connects to"},
		{`{"name":"r","required_endpoints":[{"host":"model.test","port":443}]}`, "required_endpoints[0].phase: is required (baseline, run, evaluation or evaluation_baseline)"},
		{`{"name":"r","required_endpoints":[{"host":"model.test","port":443,"phase":"rollout"}]}`, `required_endpoints[0].phase "rollout": unknown phase; use baseline, run, evaluation or evaluation_baseline`},
		{`{"name":"r","required_endpoints":[{"host":"*.model.test","port":443,"phase":"run"}]}`, `required_endpoints[0].host "*.model.test": an endpoint is one host name or address, not a wildcard or a range`},
		{`{"name":"r","required_endpoints":[{"host":"https://model.test","port":443,"phase":"run"}]}`, `required_endpoints[0].host "https://model.test": a URL scheme is not allowed`},
		{`{"name":"r","required_endpoints":[{"host":"model.test","port":443,"phase":"run","why":"x"}]}`, "required_endpoints[0].why: unknown key; an endpoint takes only host, port, phase"},
		{`{"name":"r","required_endpoints":"model.test"}`, `required_endpoints "model.test": must be a list of endpoints, not a string`},
		{`{"name":"r","run_network_policy":{"network_mode":"allowlist","allowed_hosts":["x"],"block_network":true}}`, "run_network_policy.block_network: block_network is a provider-native (modal) option"},
		{`[{"name":"a"},7]`, "[1] 7: a recipe is an object, not a number"},
		{`{"name":"r","match":{"task_ids":[]}}`, "match.task_ids: is empty; omit it to match every value"},
		{`{"name":"r","match":{"providers":[]}}`, "match.providers: is empty; omit it to match every value"},
	}
	for _, tt := range tests {
		v, err := DecodeDocument([]byte(tt.doc))
		if err != nil {
			t.Fatal(err)
		}
		_, err = ParseRecipes(v, "r")
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseRecipes(%s) error\n%v\nwant it to contain\n%s", tt.doc, err, tt.want)
		}
	}
}

func TestPlanJSONFields(t *testing.T) {
	pl := Planner{}
	for _, tc := range []struct {
		task string
		keys []string
	}{
		{`{"task_id":"t"}`, []string{"applied_recipes", "baseline_network_mode", "evaluation_mode", "evaluation_network_mode", "native", "notice", "policies", "provider", "run_network_mode", "steps", "task_id"}},
		{`{"task_id":"t","evaluation_mode":"fresh"}`, []string{"applied_recipes", "baseline_network_mode", "evaluation_baseline_network_mode", "evaluation_mode", "evaluation_network_mode", "native", "notice", "policies", "provider", "run_network_mode", "steps", "task_id"}},
	} {
		plan, err := pl.Plan(planTestTask(t, tc.task))
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(plan)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		var keys []string
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if strings.Join(keys, ",") != strings.Join(tc.keys, ",") {
			t.Errorf("plan JSON keys %v, want %v", keys, tc.keys)
		}
		if string(m["notice"]) != "null" || string(m["native"]) != "null" || string(m["applied_recipes"]) != "[]" {
			t.Errorf("public docker plan: notice %s native %s applied_recipes %s", m["notice"], m["native"], m["applied_recipes"])
		}
	}
}
