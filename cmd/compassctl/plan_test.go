package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runCaptured runs compassctl in-process through run(), with os.Stdout and os.Stderr
// redirected to files, so that the exit status and every byte either stream gets are
// what a user would see.
func runCaptured(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	dir := t.TempDir()
	outFile, err := os.Create(filepath.Join(dir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	errFile, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	origOut, origErr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = outFile, errFile
	code = run(args)
	os.Stdout, os.Stderr = origOut, origErr
	read := func(f *os.File) string {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(f)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		return string(b)
	}
	return code, read(outFile), read(errFile)
}

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

const examples = "../../examples/"

func TestPlanJSONMatchesTheGoldenPlans(t *testing.T) {
	tests := []struct {
		golden string
		args   []string
	}{
		{"examples-tasks", []string{"--task", examples + "tasks.yaml"}},
		{"examples-fresh-override", []string{"--task", examples + "task-fresh.json", "--env-params", "@" + examples + "env-params.json"}},
		{"examples-recipe", []string{"--task", examples + "task-recipe.yaml", "--recipe", examples + "recipe-model-endpoint.json"}},
		{"flags-fresh-over-shared", []string{"--task", examples + "tasks.yaml", "--evaluation-mode", "fresh"}},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			code, stdout, stderr := runCaptured(t, append([]string{"plan", "--json"}, tt.args...)...)
			if code != 0 || stderr != "" {
				t.Fatalf("exit %d, stderr %q", code, stderr)
			}
			want, err := os.ReadFile(filepath.Join("..", "..", "policy", "testdata", "plans", tt.golden+".json"))
			if err != nil {
				t.Fatal(err)
			}
			if stdout != string(want) {
				t.Errorf("plan --json differs from the golden plan %s:\n%s", tt.golden, stdout)
			}
		})
	}
}

func TestPlanTable(t *testing.T) {
	code, stdout, stderr := runCaptured(t, "plan", "--task", examples+"task-recipe.yaml", "--recipe", examples+"recipe-model-endpoint.json")
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{
		"task swe-3  provider docker  evaluation mode shared\n",
		"  run         allowlist   recipe:model-endpoint  {\"network_mode\":\"allowlist\",\"allowed_hosts\":[\"model.test:443\"]}\n",
		"  applied recipes: model-endpoint\n",
		"  4     run task (agent rollout)                     agent        run         allowlist   always\n",
		"    <IMPORTANT>\n",
		"      - model.test:443\n",
		"task swe-4  provider docker  evaluation mode shared\n",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, stdout)
		}
	}
}

func TestPlanTableShowsDockerOptions(t *testing.T) {
	code, stdout, stderr := runCaptured(t, "plan", "--task", examples+"task-fresh.json", "--env-params", `{"network":"bridge","allowlist_proxy_start_timeout":2.5}`)
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{"  docker network: bridge\n", "  proxy start timeout: 2.5s\n"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, stdout)
		}
	}
}

func TestPlanRefusesBadInput(t *testing.T) {
	badTask := writeTemp(t, "bad.yaml", "task_id: t\nrun_network_policy: {network_mode: allowlist, allowed_hosts: [\"https://x\"]}\n")
	mixed := writeTemp(t, "mixed.yaml", "- task_id: ok\n- task_id: daytona\n  provider: daytona\n  run_network_policy: {network_mode: allowlist, allowed_hosts: [model.test, 198.51.100.7]}\n")
	envFile := writeTemp(t, "env.json", `{"network":"host"}`)
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"no task file", []string{"plan"}, "compassctl: plan: --task FILE is required\n"},
		{"missing task file", []string{"plan", "--task", "/nonexistent/tasks.yaml"}, "no such file or directory"},
		{"invalid policy in a task", []string{"plan", "--task", badTask}, badTask + `: run_network_policy.allowed_hosts[0] "https://x": a URL scheme is not allowed: write the host alone, e.g. "x"` + "\n"},
		{"one task of several cannot be planned", []string{"plan", "--json", "--task", mixed}, `task "daytona": run_network_policy.allowed_hosts[1] "198.51.100.7": provider daytona, run phase: domain entries and IPv4 network entries cannot be mixed`},
		{"unknown env-params key", []string{"plan", "--task", examples + "tasks.yaml", "--env-params", `{"net":"bridge"}`}, "compassctl: --env-params: net: unknown key; --env-params takes only"},
		{"env-params not JSON", []string{"plan", "--task", examples + "tasks.yaml", "--env-params", `run_network_policy: public`}, "compassctl: --env-params: invalid JSON"},
		{"env-params file network host", []string{"plan", "--task", examples + "tasks.yaml", "--env-params", "@" + envFile}, `task "swe-1": network "host": provider docker, run phase`},
		{"env-params file missing", []string{"plan", "--task", examples + "tasks.yaml", "--env-params", "@/nonexistent.json"}, "--env-params: open /nonexistent.json"},
		{"unknown provider flag", []string{"plan", "--task", examples + "tasks.yaml", "--provider", "k8s"}, `compassctl: plan: --provider "k8s": unknown provider; use one of host_process, docker, daytona, modal`},
		{"unknown mode flag", []string{"plan", "--task", examples + "tasks.yaml", "--evaluation-mode", "reuse"}, `plan: --evaluation-mode "reuse": unknown evaluation mode; use shared or fresh`},
		{"provider flag that cannot enforce", []string{"plan", "--task", examples + "tasks.yaml", "--provider", "host_process"}, `task "swe-1": run_network_policy "allowlist": provider host_process, run phase: cannot enforce allowlist`},
		{"required endpoint blocked", []string{"plan", "--task", examples + "task-fresh.json", "--recipe", examples + "recipe-model-endpoint.json", "--json"}, `task "swe-fresh-1": run_network_policy "model.test:443": recipe model-endpoint requires this endpoint in the run phase`},
		{"same recipe twice", []string{"plan", "--task", examples + "tasks.yaml", "--recipe", examples + "recipe-model-endpoint.json", "--recipe", examples + "recipe-model-endpoint.json"}, `plan: --recipe "model-endpoint": is defined twice`},
		{"same task twice", []string{"plan", "--task", examples + "tasks.yaml", "--task", examples + "tasks.yaml"}, `plan: task "swe-1" is defined twice`},
		{"unknown flag", []string{"plan", "--task", examples + "tasks.yaml", "--yaml"}, "unknown flag: --yaml"},
		{"stray argument", []string{"plan", "--task", examples + "tasks.yaml", "extra"}, `unexpected argument "extra"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCaptured(t, tt.args...)
			if code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing on invalid input", stdout)
			}
			if !strings.Contains(stderr, tt.wantErr) {
				t.Errorf("stderr\n%s\nwant it to contain\n%s", stderr, tt.wantErr)
			}
		})
	}
}
