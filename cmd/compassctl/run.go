package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/docker"
	"github.com/compass-egress/compass-egress/internal/filelock"
)

func init() { subcommands = append(subcommands, newRunCommand) }

type runOptions struct {
	envParams   string
	recipes     []string
	concurrency int
	out         string
	resume      bool
	progress    string
	env         envFlags
}

func newRunCommand() *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run TASK_FILE... [--env-params JSON|@FILE] [--recipe FILE]... [--concurrency N] [--out DIR] [--resume]",
		Short: "Run whole task lifecycles under their phase policies, with a record of each",
		Long: `run plans every task first (nothing starts if any plan is invalid), then runs each
task's lifecycle in the order of docs/policy.md §7 for its evaluation mode (shared or fresh), with the
policy of each step in force in the Docker environment before the step starts. Each task
writes <out>/<task>/run_info.json (the plan, every transition and step, blocked attempts per
phase, artifacts) as it goes, and notice.txt (the restriction statement) unless turned off.
Ctrl-C stops cleanly: environments are closed (or kept when retained) and records written.
--resume picks interrupted tasks up from their records, or refuses with the reason (see
docs/run.md). Exit status: 0 all tasks succeeded, 1 a task failed, 2 invalid input.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError{errors.New("run: at least one TASK_FILE is required")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := refuseEmpty(cmd.Flags(), append([]string{"env-params", "out"}, providerFlags...)...); err != nil {
				return err
			}
			ctx, stop := stopOnSignal(cmd.Context(), cmd.ErrOrStderr())
			defer stop()
			return runTasks(ctx, cmd.OutOrStdout(), args, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.envParams, "env-params", "", "run-wide override as JSON, or @FILE to read it from a file")
	f.StringArrayVar(&o.recipes, "recipe", nil, "recipe file; repeatable, earlier files win when two recipes supply a field")
	f.IntVar(&o.concurrency, "concurrency", 1, "tasks run at once")
	f.StringVar(&o.out, "out", "out", "output directory: one directory per task")
	f.BoolVar(&o.resume, "resume", false, "pick interrupted tasks up from their records; finished tasks are left alone")
	f.StringVar(&o.progress, "progress", "auto", "progress display: auto (live on a terminal), live or plain")
	addProviderFlags(cmd, &o.env)
	return cmd
}

// providerFlags are the provider settings that have a default: given empty, refused.
var providerFlags = []string{"state-dir", "egress-network", "pool", "proxy-image", "probe-image", "owner"}

// addProviderFlags registers the Docker provider's settings, read from the same
// environment variables as `compassctl env`.
func addProviderFlags(cmd *cobra.Command, e *envFlags) {
	f := cmd.Flags()
	f.StringVar(&e.stateDir, "state-dir", envOr("COMPASS_STATE_DIR", docker.DefaultStateDir), "provider state directory; env COMPASS_STATE_DIR")
	f.StringVar(&e.egress, "egress-network", envOr("COMPASS_EGRESS_NETWORK", docker.DefaultEgressNetwork), "shared network with a way out; env COMPASS_EGRESS_NETWORK")
	f.StringVar(&e.pool, "pool", envOr("COMPASS_POOL", docker.DefaultPool.String()), "address range of the per-task networks; env COMPASS_POOL")
	f.IntVar(&e.subnetBits, "subnet-bits", docker.DefaultSubnetBits, "prefix length of one per-task network")
	f.StringVar(&e.proxyImage, "proxy-image", envOr("COMPASS_PROXY_IMAGE", docker.DefaultProxyImage), "compass-proxy sidecar image; env COMPASS_PROXY_IMAGE")
	f.StringVar(&e.owner, "owner", envOr("COMPASS_OWNER", docker.DefaultOwner), "owner label value; env COMPASS_OWNER")
	f.StringArrayVar(&e.dnsUpstreams, "dns-upstream", splitList(os.Getenv("COMPASS_DNS_UPSTREAM")), "resolver the sidecars forward allowed names to: an IP address, port optional (default 53); repeatable; env COMPASS_DNS_UPSTREAM")
	f.StringArrayVar(&e.proxyArgs, "proxy-arg", nil, "extra compass-proxy flag for new sidecars (repeatable)")
	f.BoolVarP(&e.verbose, "verbose", "v", false, "log each lifecycle event (JSON on stderr)")
}

func runTasks(ctx context.Context, out io.Writer, files []string, o runOptions) error {
	if o.concurrency < 1 {
		return usageError{fmt.Errorf("run: --concurrency must be at least 1, not %d", o.concurrency)}
	}
	if o.progress != "auto" && o.progress != "live" && o.progress != "plain" {
		return usageError{fmt.Errorf("run: --progress %q: use auto, live or plain", o.progress)}
	}
	plans, err := buildPlans(planOptions{tasks: files, envParams: o.envParams, recipes: o.recipes, check: docker.CheckTask})
	if err != nil {
		return usageError{err}
	}
	tasks := make([]controller.TaskRun, 0, len(plans))
	for _, p := range plans {
		t, err := controller.NewTaskRun(p)
		if err != nil {
			return err
		}
		tasks = append(tasks, t)
	}
	prov, closeClient, err := newRunProvider(&o.env)
	if err != nil {
		return err
	}
	defer closeClient()

	unlock, err := lockOutputs(ctx, o.out)
	if err != nil {
		return err
	}
	defer unlock()
	tasks, resume, skipped, err := controller.PrepareOutputs(o.out, tasks, o.resume, prov)
	if err != nil {
		return usageError{err}
	}
	for _, s := range skipped {
		fmt.Fprintf(out, "%s: already finished, left alone (--resume)\n", s)
	}
	if len(tasks) == 0 {
		return nil
	}

	level := slog.LevelWarn
	if o.env.verbose {
		level = slog.LevelInfo
	}
	r := &controller.Runner{
		Provider: prov, OutDir: o.out,
		Logger:              slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
		BlockedPollInterval: time.Second,
	}
	live := o.progress == "live" || (o.progress == "auto" && isTerminal(out))
	var stopProgress func()
	if live {
		lp := controller.NewLiveProgress(out, 200*time.Millisecond)
		r.Progress, stopProgress = lp, lp.Stop
	} else {
		r.Progress, stopProgress = controller.NewLogProgress(out), func() {}
	}
	outcomes := r.RunAll(ctx, tasks, o.concurrency, resume)
	stopProgress()
	fmt.Fprintln(out)
	controller.WriteSummary(out, o.out, outcomes)
	failed := 0
	for _, oc := range outcomes {
		if oc.Err != nil {
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("run: %d of %d tasks did not succeed", failed, len(outcomes))
	}
	return nil
}

// stopOnSignal cancels the run on the first SIGINT/SIGTERM, which closes every
// environment and writes every record; a second one exits at once, leaving the
// environments and records as they are (--resume and `compassctl env close` pick up).
func stopOnSignal(parent context.Context, errOut io.Writer) (context.Context, func()) {
	ctx, cancel := context.WithCancel(parent)
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sig:
			fmt.Fprintf(errOut, "compassctl run: %s: stopping, closing environments and writing records (again to abandon them)\n", s)
			cancel()
		case <-done:
			return
		}
		select {
		case <-sig:
			fmt.Fprintln(errOut, "compassctl run: abandoned: environments may be left running; see `compassctl env ls`")
			os.Exit(130)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sig)
		close(done)
		cancel()
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// outputLockFile, in --out, is held by the run that uses the directory.
const outputLockFile = ".compassctl-run.lock"

// lockOutputs makes a run the only one using out, or refuses at once: a second run
// would clear the first's task directories, and a --resume would reattach and close
// the environments the first is still running.
func lockOutputs(ctx context.Context, out string) (unlock func(), err error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, fmt.Errorf("run: --out %s: %w", out, err)
	}
	path := filepath.Join(out, outputLockFile)
	lctx, held := context.WithCancel(ctx)
	defer held()
	f, err := filelock.Lock(lctx, path, held)
	if err != nil {
		if lctx.Err() != nil && ctx.Err() == nil {
			return nil, fmt.Errorf("run: --out %s: another compassctl run is using it (it holds %s)", out, path)
		}
		return nil, fmt.Errorf("run: --out %s: lock: %w", out, err)
	}
	return func() { f.Close() }, nil
}
