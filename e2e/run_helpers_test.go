package e2e

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/e2e/harness"
	"github.com/compass-egress/compass-egress/internal/testutil"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// The demo images, under the tags the example task files name.
const (
	agentImage  = "compass-demo-agent:latest"
	graderImage = "compass-demo-grader:latest"
)

var (
	demoOnce sync.Once
	demoErr  error
)

// demoImages builds the demo agent and grader images once per package run, offline,
// from images/demo (a static binary and a FROM-scratch Dockerfile each).
func demoImages(t *testing.T) {
	t.Helper()
	h.Need(t)
	demoOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		demoErr = buildDemoImages(ctx)
	})
	if demoErr != nil {
		t.Fatalf("demo images: %v", demoErr)
	}
}

func buildDemoImages(ctx context.Context) error {
	root, err := harness.ModuleRoot()
	if err != nil {
		return err
	}
	bin := filepath.Join(h.BinDir, "demo")
	cmd := exec.CommandContext(ctx, harness.GoTool(), "build", "-trimpath", "-o", bin, "./images/demo")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build images/demo: %w\n%s", err, out)
	}
	binary, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	for tag, dockerfile := range map[string]string{agentImage: "Dockerfile.agent", graderImage: "Dockerfile.grader"} {
		df, err := os.ReadFile(filepath.Join(root, "images", "demo", dockerfile))
		if err != nil {
			return err
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, f := range []struct {
			name string
			data []byte
			mode int64
		}{{"Dockerfile", df, 0o644}, {"demo", binary, 0o755}} {
			if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data))}); err != nil {
				return err
			}
			if _, err := tw.Write(f.data); err != nil {
				return err
			}
		}
		if err := tw.Close(); err != nil {
			return err
		}
		resp, err := h.Docker.ImageBuild(ctx, &buf, build.ImageBuildOptions{Tags: []string{tag}, Remove: true, ForceRemove: true})
		if err != nil {
			return fmt.Errorf("build %s: %w", tag, err)
		}
		out, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("build %s: %w", tag, err)
		}
		if bytes.Contains(out, []byte(`"errorDetail"`)) {
			return fmt.Errorf("build %s: %s", tag, out)
		}
	}
	return nil
}

// removeDemoImages runs after the harness's teardown, which closed its client: it uses
// a client of its own, closed before the leak check.
func removeDemoImages(ctx context.Context) error {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return err
	}
	defer cli.Close()
	var errs []error
	for _, tag := range []string{agentImage, graderImage} {
		if _, err := cli.ImageRemove(ctx, tag, image.RemoveOptions{Force: true, PruneChildren: true}); err != nil && !cerrdefs.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// writeTask writes a task file (YAML) into dir and returns its path.
func writeTask(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// run is one `compassctl run` in progress: its output, and a way to wait or interrupt.
type run struct {
	cmd  *exec.Cmd
	out  *testutil.SyncBuffer
	done chan error
}

// startRun starts `compassctl run ARGS...` against this package's Docker objects, with
// plain progress lines.
func startRun(t *testing.T, ctx context.Context, args ...string) *run {
	t.Helper()
	cmd := h.Compassctl(ctx, append([]string{"run", "--progress", "plain"}, args...)...)
	out := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &run{cmd: cmd, out: out, done: make(chan error, 1)}
	go func() { r.done <- cmd.Wait() }()
	return r
}

// wait returns the exit status (-1 if killed by a signal) and the output.
func (r *run) wait(t *testing.T, limit time.Duration) (int, string) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(limit):
		_ = r.cmd.Process.Kill()
		<-r.done
		t.Fatalf("compassctl run did not end within %s:\n%s", limit, r.out.String())
	}
	return r.cmd.ProcessState.ExitCode(), r.out.String()
}

func (r *run) signal(sig syscall.Signal) { _ = r.cmd.Process.Signal(sig) }

// waitPhase polls a task's record until its phase is the given step.
func waitPhase(t *testing.T, r *run, dir string, step lifecycle.StepName) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if rec, err := controller.ReadRecord(dir); err == nil && rec.Phase == step {
			for _, s := range rec.Steps {
				if s.Name == step && s.Status == controller.StepRunning {
					return
				}
			}
		}
		select {
		case <-r.done:
			t.Fatalf("compassctl run ended before step %s:\n%s\n%s", step, r.out.String(), diagnose(dir))
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("step %s not reached:\n%s", step, r.out.String())
}

// diagnose gathers what a failed task left in its output directory: the steps' errors,
// the blocked summaries and the step logs.
func diagnose(dir string) string {
	var b strings.Builder
	if rec, err := controller.ReadRecord(dir); err == nil {
		for _, s := range rec.Steps {
			if s.Error != "" {
				fmt.Fprintf(&b, "step %s %s: %s\n", s.Name, s.Status, s.Error)
			}
		}
		for _, bl := range rec.Blocked {
			if bl.Summary.Total > 0 || bl.Error != "" {
				j, _ := json.Marshal(bl)
				fmt.Fprintf(&b, "blocked %s\n", j)
			}
		}
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	for _, l := range logs {
		data, _ := os.ReadFile(l)
		fmt.Fprintf(&b, "--- %s\n%s", filepath.Base(l), data)
	}
	return b.String()
}

// taskLeftovers lists the Docker objects of this package whose names mention task.
func taskLeftovers(t *testing.T, task string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	all, err := h.Leftovers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, o := range all {
		if strings.Contains(o, task) {
			out = append(out, o)
		}
	}
	return out
}

// settledLeftovers is taskLeftovers once it has stayed the same for a second. A runner
// killed inside an open may have requests in flight: the engine completes them after
// the kill (a sidecar created a moment later), and a resume started before that cannot
// see what they make. An operator's or a harness's resume comes later than the engine's
// requests end; this waits for that moment instead of racing it.
func settledLeftovers(t *testing.T, task string) []string {
	t.Helper()
	last := slices.Sorted(slices.Values(taskLeftovers(t, task)))
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		time.Sleep(time.Second)
		now := slices.Sorted(slices.Values(taskLeftovers(t, task)))
		if slices.Equal(now, last) {
			return now
		}
		last = now
	}
	t.Fatalf("task %s's Docker objects kept changing for a minute after its runner was killed: %v", task, last)
	return nil
}

// Attempt is one network attempt the demo binary reported (one JSON line).
type Attempt struct {
	Who     string `json:"who"`
	Attempt string `json:"attempt"`
	Target  string `json:"target"`
	Outcome string `json:"outcome"`
	Detail  string `json:"detail"`
}

// attemptsOf reads the attempts a step's log holds.
func attemptsOf(t *testing.T, taskDir string, s controller.StepRecord) []Attempt {
	t.Helper()
	if s.Log == "" {
		return nil
	}
	f, err := os.Open(filepath.Join(taskDir, s.Log))
	if err != nil {
		t.Fatalf("step log: %v", err)
	}
	defer f.Close()
	var out []Attempt
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var a Attempt
		if line := sc.Bytes(); len(line) > 0 && line[0] == '{' && json.Unmarshal(line, &a) == nil && a.Attempt != "" {
			out = append(out, a)
		}
	}
	return out
}

// closeUntilDone runs `compassctl env close` for task until it succeeds or within
// has passed, 20 s at most per try; a failure lists what every try printed and what
// the engine still holds of the task. A close refused only by the engine's stale
// endpoint count (docker.ErrStaleEndpointCount) ends the tries: no call can clear it,
// so the test checks that the task network is all that is left and says so.
func closeUntilDone(t *testing.T, task string, within time.Duration) {
	t.Helper()
	var tries []string
	for deadline := time.Now().Add(within); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		start := time.Now()
		out, err := h.Compassctl(ctx, "env", "close", "--task", task).CombinedOutput()
		cancel()
		if err == nil {
			return
		}
		if strings.Contains(string(out), docker.ErrStaleEndpointCount.Error()) {
			left := taskLeftovers(t, task)
			if len(left) != 1 || !strings.HasPrefix(left[0], "network ") {
				t.Fatalf("env close blamed a stale endpoint count, yet the engine holds %v:\n%s", left, out)
			}
			fmt.Fprintf(os.Stderr, "*** e2e: %s: the engine keeps a stale endpoint count on %s; left in place ***\n", t.Name(), left[0])
			return
		}
		tries = append(tries, fmt.Sprintf("after %s: %v\n%s", time.Since(start).Round(time.Millisecond), err, out))
		if time.Now().After(deadline) {
			t.Fatalf("env close failed %d times; the engine still holds %v:\n%s", len(tries), taskLeftovers(t, task), strings.Join(tries, "\n"))
		}
		time.Sleep(time.Second)
	}
}
