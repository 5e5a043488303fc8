package docker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// runLocker is a provider on stateDir for owner, as another compassctl run on the host
// would make it (no Docker: the run lock is a file).
func runLocker(t *testing.T, stateDir, owner string) *Provider {
	t.Helper()
	p, err := New(nil, Config{StateDir: stateDir, Owner: owner}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLockTask: a task's run lock, held by one provider, refuses another on the same
// state directory and owner at once, naming the task and the lock file; other tasks and
// other owners have locks of their own, and letting go frees it.
func TestLockTask(t *testing.T) {
	dir := t.TempDir()
	holder := runLocker(t, dir, "")
	unlock, err := holder.LockTask(context.Background(), "t1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, owner, task string
		held              bool
	}{
		{"same task, same owner", "", "t1", true},
		{"same task, owner given as the default", DefaultOwner, "t1", true},
		{"another task", "", "t1-eval", false},
		{"another owner", "someone-else", "t1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := runLocker(t, dir, tc.owner)
			// A context that never ends: a held lock must fail at once, not wait.
			u, err := p.LockTask(context.Background(), tc.task)
			if !tc.held {
				if err != nil {
					t.Fatalf("LockTask(%s): %v", tc.task, err)
				}
				u()
				return
			}
			if !errors.Is(err, controller.ErrTaskLocked) {
				t.Fatalf("LockTask(%s) while held: %v, want ErrTaskLocked", tc.task, err)
			}
			for _, want := range []string{"task t1", "another compassctl run holds", holder.RunLockPath("t1")} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
	unlock()
	again, err := runLocker(t, dir, "").LockTask(context.Background(), "t1")
	if err != nil {
		t.Fatalf("LockTask after the holder let go: %v", err)
	}
	again()
}

// An owner is one path element under the run locks' directory, however it is spelled;
// a task ID that cannot name Docker objects takes no lock.
func TestRunLockPath(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, runLocksDir)
	for _, owner := range []string{"compassctl", "..", ".", "a/../../b", "team a", "x.y"} {
		p := runLocker(t, dir, owner)
		path := p.RunLockPath("t1")
		if parent := filepath.Dir(filepath.Dir(path)); parent != base || filepath.Base(path) != "t1" {
			t.Errorf("owner %q: lock %s, want %s/<owner>/t1", owner, path, base)
		}
		u, err := p.LockTask(context.Background(), "t1")
		if err != nil {
			t.Errorf("owner %q: %v", owner, err)
			continue
		}
		u()
	}
	if _, err := runLocker(t, dir, "").LockTask(context.Background(), "../t1"); err == nil || !strings.Contains(err.Error(), "task ID") {
		t.Errorf("LockTask(../t1): %v, want the task ID refused", err)
	}
}

// runLockHolderEnv, set to a state directory, makes the test binary (TestMain) a run
// that takes task t1's lock there and holds it until it is killed: the child process of
// TestRunLockGoesWithItsProcess.
const runLockHolderEnv = "COMPASS_TEST_RUN_LOCK_HOLDER"

func holdRunLock(dir string) int {
	p, err := New(nil, Config{StateDir: dir}, nil)
	if err == nil {
		_, err = p.LockTask(context.Background(), "t1")
	}
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("locked")
	// Until killed: its parent never writes, and an end of input means the parent is gone.
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// TestRunLockGoesWithItsProcess: a run killed while it holds a task's lock (SIGKILL:
// nothing of it runs) leaves no lock behind, so the --resume of its record takes it.
func TestRunLockGoesWithItsProcess(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), runLockHolderEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "locked\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the holder: %q, %v", line, err)
	}
	p := runLocker(t, dir, "")
	if _, err := p.LockTask(context.Background(), "t1"); !errors.Is(err, controller.ErrTaskLocked) {
		t.Errorf("LockTask while the holder lives: %v, want ErrTaskLocked", err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	unlock, err := p.LockTask(context.Background(), "t1")
	if err != nil {
		t.Fatalf("LockTask after the holder was killed: %v", err)
	}
	unlock()
}

// TestRunLockLeavesOperatorsAlone: while a run holds a task's lock, an operator's
// `env switch` and `env close` of that task's environment still go through: they take
// the environment's own locks, never the run's.
func TestRunLockLeavesOperatorsAlone(t *testing.T) {
	r := newRig(t, "t9")
	e := r.open(t, "t9", policy.Public)
	unlock, err := runLocker(t, r.p.cfg.StateDir, "").LockTask(context.Background(), "t9")
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	// Bounded only so that a wrongly taken run lock fails the test instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.Apply(ctx, allowA, controller.PhaseLabel{Phase: "run"}); err != nil {
		t.Errorf("switch while a run holds the task: %v", err)
	}
	if err := r.p.RemoveTask(ctx, "t9", lifecycle.RoleAgent); err != nil {
		t.Errorf("close while a run holds the task: %v", err)
	}
	if left := r.leftovers("t9"); len(left) > 0 {
		t.Errorf("left after the close: %v", left)
	}
}
