package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/compass-egress/compass-egress/controller"
)

// Exec runs cmd in the agent container. The proxy variables are set for every command
// (an attached container was not created with them).
func (e *Env) Exec(ctx context.Context, cmd []string, opts controller.ExecOptions) (controller.ExecResult, error) {
	env := proxyEnv(e.plan)
	for k, v := range opts.Env {
		env[k] = v
	}
	created, err := e.p.api.ContainerExecCreate(ctx, e.agentRef, container.ExecOptions{
		Cmd: cmd, Env: envList(env), WorkingDir: opts.WorkDir, AttachStdout: true, AttachStderr: true,
	})
	if err != nil {
		return controller.ExecResult{}, fmt.Errorf("docker: exec in %s: %w", e.agentRef, err)
	}
	hj, err := e.p.api.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		return controller.ExecResult{}, fmt.Errorf("docker: exec attach: %w", err)
	}
	defer hj.Close()
	var stdout, stderr bytes.Buffer
	copied := make(chan error, 1)
	go func() {
		_, err := stdcopy.StdCopy(&stdout, &stderr, hj.Reader)
		copied <- err
	}()
	select {
	case err = <-copied:
	case <-ctx.Done():
		hj.Close()
		<-copied
		return controller.ExecResult{}, fmt.Errorf("docker: exec: %w", ctx.Err())
	}
	if err != nil {
		return controller.ExecResult{}, fmt.Errorf("docker: exec output: %w", err)
	}
	ins, err := e.p.api.ContainerExecInspect(ctx, created.ID)
	if err != nil {
		return controller.ExecResult{}, fmt.Errorf("docker: exec inspect: %w", err)
	}
	return controller.ExecResult{ExitCode: ins.ExitCode, Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}, nil
}

// Download copies srcPath from the agent container into dstDir.
func (e *Env) Download(ctx context.Context, srcPath, dstDir string) error {
	rc, _, err := e.p.api.CopyFromContainer(ctx, e.agentRef, srcPath)
	if err != nil {
		return fmt.Errorf("docker: download %s: %w", srcPath, err)
	}
	defer rc.Close()
	if err := untar(rc, dstDir); err != nil {
		return fmt.Errorf("docker: download %s: %w", srcPath, err)
	}
	return nil
}

// untar extracts regular files and directories; links and special files are skipped
// and no entry may land outside dst.
func untar(r io.Reader, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	root, err := filepath.Abs(dst)
	if err != nil {
		return err
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		target := filepath.Join(root, filepath.FromSlash(h.Name))
		if target != root && !strings.HasPrefix(target, root+string(os.PathSeparator)) {
			return fmt.Errorf("archive entry %q escapes %s", h.Name, dst)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o755|0o600)
			if err != nil {
				return err
			}
			_, cerr := io.Copy(f, tr)
			if err := f.Close(); cerr == nil {
				cerr = err
			}
			if cerr != nil {
				return cerr
			}
		}
	}
}
