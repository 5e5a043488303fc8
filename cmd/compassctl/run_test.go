package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/docker"
)

// TestRunRefusesBeforeStarting: an invalid task (or plan) is exit status 2 before any
// provider is contacted, with every problem named.
func TestRunRefusesBeforeStarting(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"bad.yaml":     "task_id: a\nimage: i\nrun: [x]\nrun_network_policy: {network_mode: allowlist}\n",
		"noimage.yaml": "- {task_id: b, run: [x]}\n- {task_id: d, image: i, run: [x], timeouts: {run: -1s}}\n",
		"good.yaml":    "task_id: c\nimage: i\nrun: [x]\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bad, good := filepath.Join(dir, "bad.yaml"), filepath.Join(dir, "good.yaml")
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"invalid plan", []string{"run", bad}, []string{"allowed_hosts"}},
		// Every problem of every task at once: a task file's, and the plans' of the
		// tasks that have none of their own, the runner's fields with them.
		{"every task's problems", []string{"run", good, filepath.Join(dir, "noimage.yaml"), bad}, []string{
			`noimage.yaml: [1].timeouts.run: must be positive`, `task "b": image: is required`, `bad.yaml: run_network_policy.allowed_hosts`}},
		{"bad env-params", []string{"run", good, "--env-params", `{"run_network_policy":"sometimes"}`}, []string{"--env-params"}},
		{"bad concurrency", []string{"run", good, "--concurrency", "0"}, []string{"--concurrency must be at least 1"}},
		{"no task file", []string{"run"}, []string{"at least one TASK_FILE"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stderr := captureStderr(t, func() {
				if code := run(tc.args); code != 2 {
					t.Errorf("exit status %d, want 2", code)
				}
			})
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q does not name %q", stderr, w)
				}
			}
		})
	}
}

func captureStderr(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = w
	done := make(chan string)
	go func() {
		var b bytes.Buffer
		_, _ = b.ReadFrom(r)
		done <- b.String()
	}()
	f()
	os.Stderr = old
	w.Close()
	return <-done
}

// TestRunRefusesATaskAnotherRunHolds: another compassctl run (another --out, the same
// state directory and owner) holds the task's run lock. This run records the task
// refused, naming the task and the lock, and exits 1 like any task that did not
// succeed; it never reaches Docker (DOCKER_HOST names a socket nothing listens on).
func TestRunRefusesATaskAnotherRunHolds(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(dir, "no-docker.sock"))
	state, out := filepath.Join(dir, "state"), filepath.Join(dir, "out")
	file := filepath.Join(dir, "task.yaml")
	if err := os.WriteFile(file, []byte("task_id: c\nimage: i\nrun: [x]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	other, err := docker.New(nil, docker.Config{StateDir: state, Owner: "o"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := other.LockTask(t.Context(), "c")
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()

	var stdout bytes.Buffer
	root := newRootCommand()
	root.SetOut(&stdout)
	root.SetArgs([]string{"run", file, "--out", out, "--state-dir", state, "--owner", "o", "--progress", "plain"})
	err = root.Execute()
	var ue usageError
	if err == nil || errors.As(err, &ue) || !strings.Contains(err.Error(), "1 of 1 tasks did not succeed") {
		t.Errorf("run: %v, want a task that did not succeed (exit 1)", err)
	}
	for _, want := range []string{"refused", "task c", "another compassctl run holds", other.RunLockPath("c")} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output does not say %q:\n%s", want, stdout.String())
		}
	}
	rec, err := controller.ReadRecord(filepath.Join(out, "c"))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != controller.StatusRefused || len(rec.Steps) != 0 {
		t.Errorf("record: status %s, steps %d; want refused with no step", rec.Status, len(rec.Steps))
	}
}
