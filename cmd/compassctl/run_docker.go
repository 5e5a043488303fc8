package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"

	"github.com/compass-egress/compass-egress/controller/docker"
)

// newRunProvider opens a Docker client and a provider configured like `compassctl env`.
func newRunProvider(f *envFlags) (docker.RunProvider, func(), error) {
	cfg := docker.Config{
		StateDir: f.stateDir, EgressNetwork: f.egress, ProxyImage: f.proxyImage, Owner: f.owner,
		SubnetBits: f.subnetBits, DNSUpstreams: f.dnsUpstreams, ExtraProxyArg: f.proxyArgs,
	}
	pool, err := netip.ParsePrefix(f.pool)
	if err != nil {
		return docker.RunProvider{}, nil, usageError{fmt.Errorf("--pool: %w", err)}
	}
	cfg.Pool = pool
	cli, err := docker.NewClient()
	if err != nil {
		return docker.RunProvider{}, nil, err
	}
	level := slog.LevelWarn
	if f.verbose {
		level = slog.LevelInfo
	}
	p, err := docker.New(cli, cfg, slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
	if err != nil {
		cli.Close()
		return docker.RunProvider{}, nil, usageError{err}
	}
	return docker.RunProvider{Provider: p}, func() { cli.Close() }, nil
}
