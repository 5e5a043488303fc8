package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compass-egress/compass-egress/internal/filelock"
)

// TestRefusesEmptyAndMalformedFlags: a flag given empty (an unset shell variable) or
// a malformed --task or verify target is bad input, refused (exit 2, naming the flag,
// the value and the rule) before anything talks to Docker or writes anything. Read as
// absent, an empty --owner acted on the default owner's environments, an empty --out
// wrote the task directories into the working directory, an empty --provider planned for
// the task files' provider; a malformed --task reached Docker and a target of port 0 ran
// a check that could only report a mismatch.
func TestRefusesEmptyAndMalformedFlags(t *testing.T) {
	state := noEngine(t)
	work := t.TempDir()
	t.Chdir(work)
	task := filepath.Join(t.TempDir(), "task.yaml")
	if err := os.WriteFile(task, []byte("task_id: t1\nimage: i\nrun: [x]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := func(args ...string) []string { return append([]string{"env", "--state-dir", state}, args...) }
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--task", task, "--env-params", ""}, `--env-params "": is empty`},
		{[]string{"plan", "--task", task, "--provider", ""}, `--provider "": is empty`},
		{[]string{"plan", "--task", task, "--evaluation-mode", ""}, `--evaluation-mode "": is empty`},
		{[]string{"policy", "match", `{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, "a.test", "--resolve", ""}, `--resolve "": is empty`},
		{[]string{"run", task, "--out", ""}, `--out "": is empty`},
		{[]string{"run", task, "--env-params", ""}, `--env-params "": is empty`},
		{[]string{"run", task, "--owner", ""}, `--owner "": is empty`},
		{[]string{"run", task, "--state-dir", ""}, `--state-dir "": is empty`},
		{[]string{"run", task, "--pool", ""}, `--pool "": is empty`},
		{env("close", "--task", "t1", "--owner", ""), `--owner "": is empty`},
		{[]string{"env", "--state-dir", "", "status", "--task", "t1"}, `--state-dir "": is empty`},
		{env("ls", "--egress-network", ""), `--egress-network "": is empty`},
		{env("open", "--task", "t1", "--image", "i", "--proxy-image", ""), `--proxy-image "": is empty`},
		{env("verify", "--task", "t1", "--probe-image", ""), `--probe-image "": is empty`},
		{env("open", "--task", "bad id", "--image", "i"), `--task: docker: task ID "bad id": use 1-63 characters`},
		{env("attach", "--task", "bad id", "--container", "c1"), `--task: docker: task ID "bad id"`},
		{env("switch", "--task", "bad id", "--policy", `"public"`), `--task: docker: task ID "bad id"`},
		{env("status", "--task", "bad id"), `--task: docker: task ID "bad id"`},
		{env("verify", "--task", "bad id"), `--task: docker: task ID "bad id"`},
		{env("close", "--task", "bad id"), `--task: docker: task ID "bad id"`},
		{env("verify", "--task", "t1", "--allowed", "a.test:0"), `--allowed "a.test:0": the port "0" is not an integer in 1..65535`},
		{env("verify", "--task", "t1", "--blocked", "a.test:70000"), `--blocked "a.test:70000": the port "70000" is not an integer in 1..65535`},
		{env("verify", "--task", "t1", "--blocked", ":443"), `--blocked ":443": the host is empty`},
		{env("verify", "--task", "t1", "--allowed", "a.test"), `--allowed "a.test": want HOST:PORT`},
		{env("verify", "--task", "t1", "--outside-port", "0"), `--outside-port "0": the port is not an integer in 1..65535`},
		{env("verify", "--task", "t1", "--allowed-tcp", "git.test"), `--allowed-tcp "git.test": want HOST:PORT`},
		{env("verify", "--task", "t1", "--blocked-tcp", "git.test:0"), `--blocked-tcp "git.test:0": the port "0" is not an integer in 1..65535`},
		{env("verify", "--task", "t1", "--tcp-banner", ""), `--tcp-banner "": want the first bytes`},
		{env("verify", "--task", "t1", "--outside", "gateway.test"), `--outside: ParseAddr("gateway.test")`},
		// Required flags, each named; --role is agent or evaluation, empty included.
		{env("status"), `--task is required`},
		{env("open", "--image", "i"), `--task is required`},
		{env("open", "--task", "t1"), `--image is required`},
		{env("attach", "--task", "t1"), `--container is required`},
		{env("close", "--task", "t1", "--role", ""), `--role "": unknown role; use agent or evaluation`},
		{env("open", "--task", "t1", "--image", "i", "--env", "A"), `--env "A": want K=V`},
		// Where the policy comes from: one source, and --phase only with --plan.
		{env("switch", "--task", "t1"), `give --policy, or --phase with --plan`},
		{env("open", "--task", "t1", "--image", "i", "--policy", `"public"`, "--plan", task), `give --policy or --plan, not both`},
		{env("open", "--task", "t1", "--image", "i", "--policy", `"public"`, "--phase", "run"), `--phase "run" picks a phase of --plan; with --policy, --phase is not used`},
		{env("switch", "--task", "t1", "--policy", `"public"`, "--phase", "run"), `--phase "run" picks a phase of --plan`},
		{env("switch", "--task", "t1", "--policy", `"sometimes"`), `--policy: policy "sometimes": unknown network mode`},
		{env("switch", "--task", "t1", "--plan", "/nonexistent/plan.json", "--phase", "run"), `--plan: open /nonexistent/plan.json: no such file or directory`},
		// Provider settings, checked before anything talks to Docker: --proxy-arg may not
		// weaken the sidecar.
		{env("status", "--task", "t1", "--pool", "10.0.0.0/33"), `--pool: netip.ParsePrefix("10.0.0.0/33")`},
		{[]string{"run", task, "--pool", "10.0.0.0/33"}, `--pool: netip.ParsePrefix("10.0.0.0/33")`},
		{env("status", "--task", "t1", `--proxy-arg=--policy="public"`), `docker: proxy arg "--policy=\"public\"": --policy is the controller's`},
		{env("open", "--task", "t1", "--image", "i", "--proxy-arg=--require-no-forwarding=false"), `docker: proxy arg "--require-no-forwarding=false": --require-no-forwarding is the controller's`},
		{[]string{"run", task, `--proxy-arg=--policy="public"`}, `docker: proxy arg "--policy=\"public\"": --policy is the controller's`},
		{[]string{"run", task, "--proxy-arg=--require-no-forwarding=0"}, `--require-no-forwarding is the controller's`},
		{env("close", "--task", "t1", "--dns-upstream", "dns.test"), `docker: dns upstream "dns.test"`},
		{[]string{"run", task, "--progress", "fancy"}, `run: --progress "fancy": use auto, live or plain`},
		{[]string{"run", task, "--subnet-bits", "30"}, `docker: subnet size /30 does not fit pool`},
	}
	for _, tc := range tests {
		name := strings.NewReplacer(task, "task.yaml", state, "STATE").Replace(strings.Join(tc.args, " "))
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := runCaptured(t, tc.args...)
			if code != 2 || stdout != "" || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d stdout %q stderr %q; want exit 2 and %q", code, stdout, stderr, tc.want)
			}
			for _, dir := range []string{state, work} {
				if entries, _ := os.ReadDir(dir); len(entries) != 0 {
					t.Errorf("%s written before the refusal: %v", dir, entries)
				}
			}
		})
	}
}

// TestRunRefusesAnOutputDirInUse: a second run on the --out of a run still going is
// refused before it clears a task directory (a fresh run) or reattaches the first run's
// environments (--resume); once the first run ends, its lock is free.
func TestRunRefusesAnOutputDirInUse(t *testing.T) {
	state := noEngine(t)
	task := filepath.Join(t.TempDir(), "task.yaml")
	if err := os.WriteFile(task, []byte("task_id: t1\nimage: i\nrun: [x]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	record := filepath.Join(out, "t1", "run_info.json")
	if err := os.MkdirAll(filepath.Dir(record), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(record, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	held, err := filelock.Lock(context.Background(), filepath.Join(out, outputLockFile), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, extra := range [][]string{nil, {"--resume"}} {
		args := append([]string{"run", task, "--out", out, "--state-dir", state}, extra...)
		code, _, stderr := runCaptured(t, args...)
		if code != 1 || !strings.Contains(stderr, "another compassctl run is using it") {
			t.Errorf("%v: exit %d stderr %q; want exit 1 and the run that holds --out named", extra, code, stderr)
		}
		if _, err := os.Stat(record); err != nil {
			t.Errorf("%v: the running task's record was touched: %v", extra, err)
		}
	}
	held.Close()
	unlock, err := lockOutputs(context.Background(), out)
	if err != nil {
		t.Fatalf("lock after the holder ended: %v", err)
	}
	unlock()
}
