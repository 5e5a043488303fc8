package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/docker/docker/client"
	"github.com/spf13/cobra"

	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

func init() { subcommands = append(subcommands, newEnvCommand) }

// envFlags are the flags every `env` subcommand shares.
type envFlags struct {
	stateDir, egress, pool, proxyImage, probeImage, owner string
	subnetBits                                            int
	dnsUpstreams, proxyArgs                               []string
	stepDelay                                             time.Duration
	json, verbose                                         bool
}

func (f *envFlags) provider() (*docker.Provider, func(), error) {
	p, _, done, err := f.connect()
	return p, done, err
}

// connect opens a Docker client and the provider that drives it; done closes the client.
func (f *envFlags) connect() (*docker.Provider, *client.Client, func(), error) {
	cfg := docker.Config{
		StateDir: f.stateDir, EgressNetwork: f.egress, ProxyImage: f.proxyImage, ProbeImage: f.probeImage,
		Owner: f.owner, SubnetBits: f.subnetBits, DNSUpstreams: f.dnsUpstreams, ExtraProxyArg: f.proxyArgs,
		StepDelay: f.stepDelay,
	}
	pool, err := netip.ParsePrefix(f.pool)
	if err != nil {
		return nil, nil, nil, usageError{fmt.Errorf("--pool: %w", err)}
	}
	cfg.Pool = pool
	cli, err := docker.NewClient()
	if err != nil {
		return nil, nil, nil, err
	}
	level := slog.LevelWarn
	if f.verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	p, err := docker.New(cli, cfg, log)
	if err != nil {
		cli.Close()
		return nil, nil, nil, usageError{err}
	}
	return p, cli, func() { cli.Close() }, nil
}

// lookup finds the environment the task flags name; done closes the Docker client.
func (f *envFlags) lookup(ctx context.Context, t taskFlags, role lifecycle.Role) (*docker.Env, func(), error) {
	p, done, err := f.provider()
	if err != nil {
		return nil, nil, err
	}
	e, err := p.LookupTask(ctx, t.task, role)
	if err != nil {
		done()
		return nil, nil, err
	}
	return e, done, nil
}

// print writes v as JSON with --json, or calls text otherwise.
func (f *envFlags) print(w io.Writer, v any, text func(io.Writer)) error {
	if f.json {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	text(w)
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// signalContext is cancelled on SIGINT/SIGTERM, so that a switch interrupted from the
// terminal still runs its fail-closed path.
func signalContext(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
}

func newEnvCommand() *cobra.Command {
	f := &envFlags{}
	cmd := &cobra.Command{
		Use:   "env",
		Short: "Open, switch, verify and close Docker environments under egress control",
		Long: `env drives the Docker provider: each environment is an agent container on a
per-task internal network whose only way out is a compass-proxy sidecar. See docs/docker.md.`,
		Args: groupArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		// Before any subcommand talks to Docker: an empty --owner would act on the
		// default owner's environments, an empty --state-dir read the default one.
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return refuseEmpty(cmd.Flags(), providerFlags...)
		},
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.stateDir, "state-dir", envOr("COMPASS_STATE_DIR", docker.DefaultStateDir), "state directory (admin sockets, intended policies, transitions.jsonl); env COMPASS_STATE_DIR")
	pf.StringVar(&f.egress, "egress-network", envOr("COMPASS_EGRESS_NETWORK", docker.DefaultEgressNetwork), "shared network with a way out; env COMPASS_EGRESS_NETWORK")
	pf.StringVar(&f.pool, "pool", envOr("COMPASS_POOL", docker.DefaultPool.String()), "address range of the per-task networks; env COMPASS_POOL")
	pf.IntVar(&f.subnetBits, "subnet-bits", docker.DefaultSubnetBits, "prefix length of one per-task network")
	pf.StringVar(&f.proxyImage, "proxy-image", envOr("COMPASS_PROXY_IMAGE", docker.DefaultProxyImage), "compass-proxy sidecar image; env COMPASS_PROXY_IMAGE")
	pf.StringVar(&f.probeImage, "probe-image", envOr("COMPASS_PROBE_IMAGE", docker.DefaultProbeImage), "verify probe image; env COMPASS_PROBE_IMAGE")
	pf.StringVar(&f.owner, "owner", envOr("COMPASS_OWNER", docker.DefaultOwner), "owner label value: the controller manages only objects carrying it; env COMPASS_OWNER")
	pf.StringArrayVar(&f.dnsUpstreams, "dns-upstream", splitList(os.Getenv("COMPASS_DNS_UPSTREAM")), "resolver the sidecar forwards allowed names to: an IP address, port optional (default 53); repeatable; env COMPASS_DNS_UPSTREAM (comma-separated)")
	pf.StringArrayVar(&f.proxyArgs, "proxy-arg", nil, "extra compass-proxy flag for new sidecars (repeatable)")
	pf.DurationVar(&f.stepDelay, "step-delay", 0, "pause between the steps of a switch (testing: lets a kill land mid-switch)")
	_ = pf.MarkHidden("step-delay")
	pf.BoolVar(&f.json, "json", false, "print JSON")
	pf.BoolVarP(&f.verbose, "verbose", "v", false, "log each step (JSON on stderr)")
	for _, sub := range []func(*envFlags) *cobra.Command{
		newEnvOpenCommand, newEnvAttachCommand, newEnvSwitchCommand, newEnvStatusCommand,
		newEnvVerifyCommand, newEnvCloseCommand, newEnvListCommand, newEnvDoctorCommand, newEnvImageCommand,
	} {
		cmd.AddCommand(sub(f))
	}
	return cmd
}

// taskFlags are --task and --role, which name one environment.
type taskFlags struct{ task, role string }

func (t *taskFlags) bind(cmd *cobra.Command) {
	cmd.Flags().StringVar(&t.task, "task", "", "task ID")
	cmd.Flags().StringVar(&t.role, "role", string(lifecycle.RoleAgent), "agent or evaluation")
}

// parse checks --task (checkTask) and reads --role.
func (t taskFlags) parse() (lifecycle.Role, error) {
	if err := checkTask(t.task); err != nil {
		return "", err
	}
	return parseRole(t.role)
}

// parseRole checks --role before anything starts: an environment opened under any other
// role would carry it in its labels, and its task's commands could not find it again.
func parseRole(s string) (lifecycle.Role, error) {
	switch r := lifecycle.Role(s); r {
	case lifecycle.RoleAgent, lifecycle.RoleEvaluation:
		return r, nil
	}
	return "", usageError{fmt.Errorf("--role %q: unknown role; use %s or %s", s, lifecycle.RoleAgent, lifecycle.RoleEvaluation)}
}

// checkTask refuses a missing or malformed --task before anything talks to Docker.
func checkTask(task string) error {
	if task == "" {
		return usageError{errors.New("--task is required")}
	}
	if err := docker.ValidateTask(task); err != nil {
		return usageError{fmt.Errorf("--task: %w", err)}
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

// errFailed makes a command exit 1 after it printed its own report.
var errFailed = errors.New("check failed (see report)")
