// Command proxybench measures compass-proxy against direct connections, squid and
// tinyproxy on loopback, and (as root) compass-proxy's transparent path against its
// explicit one in network namespaces it creates and removes, and prints the comparison
// as Markdown tables (see docs/bench.md).
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"time"

	"github.com/compass-egress/compass-egress/bench/proxybench"
)

func main() {
	lim := proxybench.DefaultLimits()
	cfg := proxybench.Config{Progress: os.Stderr}
	flag.StringVar(&cfg.Compass, "compass", "bin/compass-proxy", "compass-proxy binary (empty: leave it out)")
	flag.StringVar(&cfg.Squid, "squid", lookPath("squid"), "squid binary (empty: leave it out)")
	flag.IntVar(&cfg.SquidWorkers, "squid-workers", 1, "squid's worker processes (1: its default, at most one CPU)")
	flag.StringVar(&cfg.Tinyproxy, "tinyproxy", lookPath("tinyproxy"), "tinyproxy binary (empty: leave it out)")
	flag.IntVar(&cfg.AllowlistSize, "allowlist", 100_000, "entries of the large allowlist policy")
	flag.IntVar(&cfg.Rounds, "rounds", 9, "rounds of rate measurements (the median is reported)")
	flag.DurationVar(&cfg.Settle, "settle", time.Second, "wait before reading memory with the idle tunnels open")
	flag.DurationVar(&lim.Duration, "duration", lim.Duration, "length of each rate measurement")
	flag.IntVar(&lim.Concurrency, "concurrency", lim.Concurrency, "parallel clients for set-ups and requests")
	flag.IntVar(&lim.IdleTunnels, "idle-tunnels", lim.IdleTunnels, "idle tunnels for the memory measurement")
	flag.IntVar(&lim.LatencyRequests, "latency-requests", lim.LatencyRequests, "sequential requests per round for latency")
	flag.BoolVar(&cfg.Transparent, "transparent", true, "also measure compass-proxy's transparent path beside its explicit one, in network namespaces the run creates and removes (needs root)")
	keep := flag.Bool("keep", false, "keep the scratch directory (configurations, proxy logs)")
	workloads := flag.String("workloads", "all", "comma-separated measurements to run: bulk, setups, requests, latency, idle, all")
	flag.Func("compass-arg", "further compass-proxy flag, e.g. --log-level=warn (repeatable)", func(v string) error {
		cfg.CompassArgs = append(cfg.CompassArgs, v)
		return nil
	})
	flag.Parse()
	cfg.Limits = lim
	var err error
	if cfg.Workloads, err = proxybench.ParseWorkloads(*workloads); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	if err := run(cfg, *keep); err != nil {
		slog.New(slog.NewJSONHandler(os.Stderr, nil)).Error("proxybench failed", "err", err)
		os.Exit(1)
	}
}

func run(cfg proxybench.Config, keep bool) error {
	if _, err := proxybench.RaiseFileLimit(); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "proxybench-")
	if err != nil {
		return fmt.Errorf("proxybench: %w", err)
	}
	if keep {
		fmt.Fprintf(os.Stderr, "scratch directory: %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	cfg.Dir = dir
	start := time.Now()
	rep, err := proxybench.Run(cfg)
	if rep != nil {
		rep.Notes = append(rep.Notes, fmt.Sprintf("Whole run: %s.", time.Since(start).Round(time.Second)))
		rep.WriteMarkdown(os.Stdout)
	}
	return err
}

func lookPath(name string) string {
	p, err := exec.LookPath(name)
	if err != nil {
		return ""
	}
	return p
}
