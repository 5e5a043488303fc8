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
	stdout, stderr := &boundedBuffer{}, &boundedBuffer{}
	copied := make(chan error, 1)
	go func() {
		_, err := stdcopy.StdCopy(stdout, stderr, hj.Reader)
		copied <- err
	}()
	select {
	case err = <-copied:
	case <-ctx.Done():
		hj.Close()
		<-copied
		// What the command printed before the cut is kept: the step log of a timed-out
		// rollout shows how far it got.
		return stdout.result(stderr, 0), fmt.Errorf("docker: exec: %w", ctx.Err())
	}
	if err != nil {
		return stdout.result(stderr, 0), fmt.Errorf("docker: exec output: %w", err)
	}
	ins, err := e.p.api.ContainerExecInspect(ctx, created.ID)
	if err != nil {
		return stdout.result(stderr, 0), fmt.Errorf("docker: exec inspect: %w", err)
	}
	return stdout.result(stderr, ins.ExitCode), nil
}

// maxExecOutput bounds what one command's stdout, and its stderr, keep in memory and in
// the step log: a command printing without end (the agent's, say) must not exhaust the
// controller, which runs every task of the run.
const maxExecOutput = 8 << 20

// boundedBuffer keeps the first maxExecOutput bytes written to it and counts the rest.
type boundedBuffer struct {
	buf     bytes.Buffer
	dropped int64
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	keep := min(len(p), maxExecOutput-b.buf.Len())
	b.buf.Write(p[:keep])
	b.dropped += int64(len(p) - keep)
	return len(p), nil
}

// bytes is what was kept, with a line saying how much was not.
func (b *boundedBuffer) bytes() []byte {
	if b.dropped == 0 {
		return b.buf.Bytes()
	}
	return fmt.Appendf(b.buf.Bytes(), "\n[compass-egress: %d more bytes of output not kept]\n", b.dropped)
}

func (b *boundedBuffer) result(stderr *boundedBuffer, exit int) controller.ExecResult {
	return controller.ExecResult{ExitCode: exit, Stdout: b.bytes(), Stderr: stderr.bytes()}
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
