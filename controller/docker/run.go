package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// RunProvider is the provider `compassctl run` drives. It gives the lifecycle runner
// what it needs beyond the shared interface: reattaching an environment a crashed run
// left (for --resume), removing what is left of one, copying saved artifacts into a
// fresh evaluation environment, stopping a command its step cut, telling how to reach a
// retained environment, and (the embedded Provider's LockTask) keeping a task to one run
// at a time.
type RunProvider struct {
	*Provider
}

var _ interface {
	controller.Reattacher
	controller.Remover
	controller.TaskLocker
} = RunProvider{}

// Open opens the environment as Provider.Open does, for the runner.
func (p RunProvider) Open(ctx context.Context, spec controller.EnvSpec) (controller.Environment, error) {
	e, err := p.OpenEnv(ctx, spec)
	if err != nil {
		return nil, err
	}
	return runEnv{Env: e}, nil
}

// Reattach finds the environment of a task's role that another process opened.
func (p RunProvider) Reattach(ctx context.Context, task string, role lifecycle.Role) (controller.Environment, error) {
	e, err := p.LookupTask(ctx, task, role)
	if errors.Is(err, ErrNoEnvironment) {
		return nil, fmt.Errorf("%w: %w", controller.ErrEnvironmentGone, err)
	}
	if err != nil {
		return nil, err
	}
	return runEnv{Env: e}, nil
}

// RemoveEnvironment removes whatever exists of the environment of a task's role
// (Provider.RemoveTask): through its sidecar when it has one, else by name (a
// half-finished open).
func (p RunProvider) RemoveEnvironment(ctx context.Context, task string, role lifecycle.Role) (string, error) {
	return EnvID(task, role), p.RemoveTask(ctx, task, role)
}

// runEnv is an environment as the runner uses it.
type runEnv struct {
	*Env
}

var _ interface {
	controller.Uploader
	controller.Reacher
} = runEnv{}

// Exec runs cmd; when the step's context cuts it (timeout, Ctrl-C), the command is
// killed too, so that a timed-out rollout or grader does not keep running into the next
// phase (and its policy). Docker has no call to stop an exec; see killCutCommands.
func (e runEnv) Exec(ctx context.Context, cmd []string, opts controller.ExecOptions) (controller.ExecResult, error) {
	res, err := e.Env.Exec(ctx, cmd, opts)
	if err != nil && ctx.Err() != nil {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if kerr := e.killCutCommands(kctx); kerr != nil {
			err = errors.Join(err, fmt.Errorf("%w: %w", controller.ErrCommandNotStopped, kerr))
		}
	}
	return res, err
}

// killCutCommands kills every exec'd command still running in the agent container, with
// its descendants. Seen from the host, a process of the container whose parent is not
// in the container's PID namespace was started by `docker exec` (processes left behind
// by an ended command are re-parented to the container's init instead). The runner
// runs one command at a time per environment, so that is the command just cut.
func (e runEnv) killCutCommands(ctx context.Context) error {
	ci, err := e.p.api.ContainerInspect(ctx, e.AgentContainer())
	if err != nil {
		return fmt.Errorf("run: stop the cut command: %w", err)
	}
	if ci.State == nil || ci.State.Pid == 0 {
		return nil // not running: nothing left to stop
	}
	init := ci.State.Pid
	parent, err := namespaceParents(init)
	if err != nil {
		return fmt.Errorf("run: stop the cut command: %w", err)
	}
	var kill []int
	for pid, ppid := range parent {
		if _, inside := parent[ppid]; pid != init && !inside {
			kill = append(kill, descendants(pid, parent)...)
		}
	}
	var errs []error
	for _, pid := range kill {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("run: kill %d in %s: %w", pid, e.AgentContainer(), err))
		}
	}
	return errors.Join(errs...)
}

// namespaceParents maps each process in the PID namespace of the host process init to
// its parent.
func namespaceParents(init int) (map[int]int, error) {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", init))
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	parent := map[int]int{}
	for _, d := range entries {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if link, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err != nil || link != ns {
			continue
		}
		if ppid, ok := parentPID(pid); ok {
			parent[pid] = ppid
		}
	}
	return parent, nil
}

// parentPID reads a process's parent from /proc/<pid>/stat (the field after the
// parenthesised command name, which may itself hold spaces and parentheses).
func parentPID(pid int) (int, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	return statParent(b)
}

// statParent reads the parent PID out of a /proc/<pid>/stat line.
func statParent(b []byte) (int, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// descendants is pid and every process below it.
func descendants(pid int, parent map[int]int) []int {
	out := []int{pid}
	for child, ppid := range parent {
		if ppid == pid {
			out = append(out, descendants(child, parent)...)
		}
	}
	return out
}

// Upload copies a host file or directory into the agent container at dstDir/<name>,
// creating the directories on the way (a FROM-scratch image may not have them).
func (e runEnv) Upload(ctx context.Context, srcPath, dstDir string) error {
	buf, err := uploadArchive(srcPath, dstDir)
	if err != nil {
		return fmt.Errorf("run: upload: %w", err)
	}
	if err := e.p.api.CopyToContainer(ctx, e.AgentContainer(), "/", buf, container.CopyToContainerOptions{}); err != nil {
		return fmt.Errorf("run: upload %s to %s: %w", srcPath, e.AgentContainer(), err)
	}
	return nil
}

// uploadArchive is the tar Upload copies in at the container's root: srcPath is a saved
// artifact, a file or a directory (Download saves either), with everything below it.
// Download kept only regular files and directories, so nothing else is looked for.
func uploadArchive(srcPath, dstDir string) (*bytes.Buffer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := strings.Trim(path.Clean("/"+dstDir), "/")
	if dir != "" {
		parts := strings.Split(dir, "/")
		for i := range parts {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.Join(parts[:i+1], "/") + "/", Mode: 0o755}); err != nil {
				return nil, err
			}
		}
	}
	top := path.Join(dir, filepath.Base(srcPath))
	err := filepath.WalkDir(srcPath, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(srcPath, p)
		if err != nil {
			return err
		}
		name := path.Join(top, filepath.ToSlash(rel))
		switch {
		case d.IsDir():
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755})
		case d.Type().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data))}); err != nil {
				return err
			}
			_, err = tw.Write(data)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return &buf, nil
}

// Reach tells an operator how to get into a retained environment and remove it.
func (e runEnv) Reach() string {
	return fmt.Sprintf("docker exec -it %s <cmd>; `compassctl env status --task %s` shows its policy, `compassctl env close --task %s` removes it",
		e.AgentContainer(), e.ID(), e.ID())
}
