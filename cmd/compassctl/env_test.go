package main

import (
	"maps"
	"path/filepath"
	"strings"
	"testing"
)

// noEngine points the Docker client at a socket that does not exist and the state at a
// temporary directory, so that a command that wrongly gets past its input checks fails
// to connect rather than reaching a real engine.
func noEngine(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(dir, "no-engine.sock"))
	return filepath.Join(dir, "state")
}

// TestEnvRefusesUnknownRole: --role is agent or evaluation. An environment opened under
// any other role would be labelled with it, and no command of its task could find it
// again without repeating the typo.
func TestEnvRefusesUnknownRole(t *testing.T) {
	state := noEngine(t)
	tests := [][]string{
		{"open", "--task", "t1", "--image", "img", "--role", "evaluator"},
		{"attach", "--task", "t1", "--container", "c1", "--role", "evaluator"},
		{"switch", "--task", "t1", "--policy", `"no-network"`, "--role", "evaluator"},
		{"status", "--task", "t1", "--role", "evaluator"},
		{"verify", "--task", "t1", "--role", "evaluator"},
		{"close", "--task", "t1", "--role", "evaluator"},
	}
	for _, args := range tests {
		t.Run(args[0], func(t *testing.T) {
			code, stdout, stderr := runCaptured(t, append([]string{"env", "--state-dir", state}, args...)...)
			want := `--role "evaluator": unknown role; use agent or evaluation`
			if code != 2 || stdout != "" || !strings.Contains(stderr, want) {
				t.Errorf("exit %d stdout %q stderr %q; want exit 2 and %q", code, stdout, stderr, want)
			}
		})
	}
}

// TestUnknownCommandsAndStrayArguments: a mistyped command or a stray argument is bad
// input (exit 2, documented), not help with exit 0 that a script reads as success, and a
// command that changes state does not silently drop part of what it was told.
func TestUnknownCommandsAndStrayArguments(t *testing.T) {
	state := noEngine(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"swtich"}, `unknown command "swtich" for "compassctl"`},
		{[]string{"env", "verfy", "--json"}, `unknown command "verfy" for "compassctl env"`},
		{[]string{"env", "image", "biuld"}, `unknown command "biuld" for "compassctl env image"`},
		{[]string{"env", "close", "--task", "t1", "t2"}, `unexpected argument "t2"`},
		{[]string{"env", "switch", "--task", "t1", "--policy", `"no-network"`, "t2"}, `unexpected argument "t2"`},
		{[]string{"env", "status", "--task", "t1", "t2"}, `unexpected argument "t2"`},
		{[]string{"env", "verify", "--task", "t1", "t2"}, `unexpected argument "t2"`},
		{[]string{"env", "attach", "--task", "t1", "--container", "c1", "c2"}, `unexpected argument "c2"`},
		{[]string{"env", "ls", "all"}, `unexpected argument "all"`},
		{[]string{"env", "doctor", "now"}, `unexpected argument "now"`},
		{[]string{"env", "image", "build", "now"}, `unexpected argument "now"`},
		{[]string{"env", "image", "load"}, `want FILE: FILE is missing`},
		{[]string{"env", "image", "save", "a.tar", "b.tar"}, `want FILE: "b.tar" is one argument too many`},
		{[]string{"env", "image", "save", ""}, `want FILE: FILE is empty`},
		{[]string{"env", "image", "load", "/"}, `load "/": is a directory`},
		{[]string{"env", "image", "load", "/nonexistent/images.tar"}, `load "/nonexistent/images.tar": stat /nonexistent/images.tar: no such file or directory`},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			args := tc.args
			if args[0] == "env" {
				args = append([]string{"env", "--state-dir", state}, args[1:]...)
			}
			code, stdout, stderr := runCaptured(t, args...)
			if code != 2 || stdout != "" || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d stdout %q stderr %q; want exit 2 and %q", code, stdout, stderr, tc.want)
			}
		})
	}
}

// TestEnvPhaseNeedsPlan: --phase picks a phase out of --plan. Alone, open and attach
// dropped it and started under public; switch with --plan but no --phase looked for a
// phase named "switch" that nobody wrote.
func TestEnvPhaseNeedsPlan(t *testing.T) {
	state := noEngine(t)
	plan := writeTemp(t, "plan.json", `{"run_network_policy": "no-network"}`)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"open", "--task", "t1", "--image", "img", "--phase", "run"}, `--phase "run" needs --plan FILE to take the policy from`},
		{[]string{"attach", "--task", "t1", "--container", "c1", "--phase", "run"}, `--phase "run" needs --plan FILE to take the policy from`},
		{[]string{"switch", "--task", "t1", "--plan", plan}, `--plan needs --phase (baseline, run, evaluation or evaluation_baseline)`},
	}
	for _, tc := range tests {
		t.Run(tc.args[0], func(t *testing.T) {
			code, stdout, stderr := runCaptured(t, append([]string{"env", "--state-dir", state}, tc.args...)...)
			if code != 2 || stdout != "" || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d stdout %q stderr %q; want exit 2 and %q", code, stdout, stderr, tc.want)
			}
		})
	}
}

// TestEnvProxyStartTimeoutBounds: --proxy-start-timeout takes what
// allowlist_proxy_start_timeout takes. Zero or negative was silently replaced by the
// default.
func TestEnvProxyStartTimeoutBounds(t *testing.T) {
	state := noEngine(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"open", "--task", "t1", "--image", "img", "--proxy-start-timeout", "0s"}, `--proxy-start-timeout 0s: must be positive`},
		{[]string{"attach", "--task", "t1", "--container", "c1", "--proxy-start-timeout", "-5s"}, `--proxy-start-timeout -5s: must be positive`},
		{[]string{"open", "--task", "t1", "--image", "img", "--proxy-start-timeout", "2h"}, `--proxy-start-timeout 2h0m0s: must be at most 1h0m0s`},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCaptured(t, append([]string{"env", "--state-dir", state}, tc.args...)...)
			if code != 2 || stdout != "" || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d stdout %q stderr %q; want exit 2 and %q", code, stdout, stderr, tc.want)
			}
		})
	}
}

func TestParseEnvVars(t *testing.T) {
	tests := []struct {
		in      []string
		want    map[string]string
		wantErr string
	}{
		{[]string{"A=1", "B=x=y", "C="}, map[string]string{"A": "1", "B": "x=y", "C": ""}, ""},
		{[]string{"A"}, nil, `--env "A": want K=V`},
		{[]string{"=1"}, nil, `--env "=1": want K=V`},
		// Last one wins would hide the first from whoever reads the command line.
		{[]string{"HTTP_PROXY=a", "HTTP_PROXY=b"}, nil, `--env "HTTP_PROXY=b": HTTP_PROXY is given twice`},
	}
	for _, tc := range tests {
		got, err := parseEnvVars(tc.in)
		if tc.wantErr != "" {
			if err == nil || err.Error() != tc.wantErr {
				t.Errorf("parseEnvVars(%q) error %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !maps.Equal(got, tc.want) {
			t.Errorf("parseEnvVars(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// TestEnvEmptyPolicyFlags: an empty --policy or --plan (an unset shell variable) is bad
// input. Read as absent, open and attach started under the runtime default, public.
func TestEnvEmptyPolicyFlags(t *testing.T) {
	state := noEngine(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"open", "--task", "t1", "--image", "img", "--policy", ""}, `--policy "": is empty; give a policy ('"public"' for no restriction)`},
		{[]string{"attach", "--task", "t1", "--container", "c1", "--plan", ""}, `--plan "": is empty; give a plan file`},
		{[]string{"switch", "--task", "t1", "--policy", ""}, `--policy "": is empty`},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCaptured(t, append([]string{"env", "--state-dir", state}, tc.args...)...)
			if code != 2 || stdout != "" || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d stdout %q stderr %q; want exit 2 and %q", code, stdout, stderr, tc.want)
			}
		})
	}
}
