package docker

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/internal/filelock"
)

var _ controller.TaskLocker = (*Provider)(nil)

// runLocksDir, under the state directory, holds the run locks: one directory per owner,
// one file per task. Like the open locks, they live apart from the environment
// directories, which a close removes.
const runLocksDir = ".run-locks"

// RunLockPath is the file a run of the task holds its lock on (LockTask). The owner is
// escaped to one path element (dots too, so that "." and ".." name no directory).
func (p *Provider) RunLockPath(task string) string {
	owner := strings.ReplaceAll(url.PathEscape(p.cfg.Owner), ".", "%2E")
	return filepath.Join(p.cfg.StateDir, runLocksDir, owner, task)
}

// LockTask takes the task's run lock (controller.TaskLocker): an exclusive flock on
// RunLockPath, which fails at once while another process holds it. It guards only the
// runner: `env close` and `env switch` take the environment's own locks, never this one,
// so an operator can still act on a running task's environment.
func (p *Provider) LockTask(ctx context.Context, task string) (unlock func(), err error) {
	if err := ValidateTask(task); err != nil {
		return nil, err
	}
	path := p.RunLockPath(task)
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("docker: task %s: run lock: %w", task, err)
	}
	// Busy cancels the wait: a run does not queue behind another run of its task.
	lctx, busy := context.WithCancel(ctx)
	defer busy()
	f, err := filelock.Lock(lctx, path, busy)
	switch {
	case err != nil && lctx.Err() != nil && ctx.Err() == nil:
		return nil, fmt.Errorf("docker: task %s: %w: it holds the run lock %s (owner %q)", task, controller.ErrTaskLocked, path, p.cfg.Owner)
	case err != nil:
		return nil, fmt.Errorf("docker: task %s: run lock %s: %w", task, path, err)
	}
	return func() { f.Close() }, nil
}
