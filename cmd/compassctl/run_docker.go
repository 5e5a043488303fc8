package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/docker"
)

// runProvider gives the runner what it needs from Docker beyond the shared interface:
// reattaching an environment a crashed run left (for --resume), copying saved artifacts
// into a fresh evaluation environment, and telling how to reach a retained one.
type runProvider struct {
	*docker.Provider
	cli *client.Client
}

// newRunProvider opens a Docker client and a provider configured like `compassctl env`.
func newRunProvider(f *envFlags) (runProvider, func(), error) {
	cfg := docker.Config{
		StateDir: f.stateDir, EgressNetwork: f.egress, ProxyImage: f.proxyImage, Owner: f.owner,
		SubnetBits: f.subnetBits, DNSUpstreams: f.dnsUpstreams, ExtraProxyArg: f.proxyArgs,
	}
	if f.pool != "" {
		pool, err := netip.ParsePrefix(f.pool)
		if err != nil {
			return runProvider{}, nil, usageError{fmt.Errorf("--pool: %w", err)}
		}
		cfg.Pool = pool
	}
	cli, err := docker.NewClient()
	if err != nil {
		return runProvider{}, nil, err
	}
	level := slog.LevelWarn
	if f.verbose {
		level = slog.LevelInfo
	}
	p, err := docker.New(cli, cfg, slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
	if err != nil {
		cli.Close()
		return runProvider{}, nil, usageError{err}
	}
	return runProvider{Provider: p, cli: cli}, func() { cli.Close() }, nil
}

func (p runProvider) Open(ctx context.Context, spec controller.EnvSpec) (controller.Environment, error) {
	e, err := p.OpenEnv(ctx, spec)
	if err != nil {
		return nil, err
	}
	return runEnv{Env: e, cli: p.cli}, nil
}

// Reattach finds the environment of a task's role that another process opened.
func (p runProvider) Reattach(ctx context.Context, task string, role controller.Role) (controller.Environment, error) {
	e, err := p.Lookup(ctx, docker.EnvID(task, role))
	if err != nil {
		return nil, err
	}
	return runEnv{Env: e, cli: p.cli}, nil
}

type runEnv struct {
	*docker.Env
	cli *client.Client
}

// Upload copies a host file into the agent container at dstDir/<name>, creating the
// directories on the way (a FROM-scratch image may not have them).
func (e runEnv) Upload(ctx context.Context, srcPath, dstDir string) error {
	data, err := os.ReadFile(srcPath)
	if err != nil {
		return fmt.Errorf("run: upload: %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := strings.Trim(path.Clean("/"+dstDir), "/")
	if dir != "" {
		parts := strings.Split(dir, "/")
		for i := range parts {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.Join(parts[:i+1], "/") + "/", Mode: 0o755}); err != nil {
				return fmt.Errorf("run: upload: %w", err)
			}
		}
	}
	name := path.Join(dir, path.Base(srcPath))
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data))}); err != nil {
		return fmt.Errorf("run: upload: %w", err)
	}
	if _, err := tw.Write(data); err != nil {
		return fmt.Errorf("run: upload: %w", err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("run: upload: %w", err)
	}
	if err := e.cli.CopyToContainer(ctx, e.AgentContainer(), "/", &buf, container.CopyToContainerOptions{}); err != nil {
		return fmt.Errorf("run: upload %s to %s: %w", srcPath, e.AgentContainer(), err)
	}
	return nil
}

// Reach tells an operator how to get into a retained environment and remove it.
func (e runEnv) Reach() string {
	return fmt.Sprintf("docker exec -it %s <cmd>; `compassctl env status --task %s` shows its policy, `compassctl env close --task %s` removes it",
		e.AgentContainer(), e.ID(), e.ID())
}
