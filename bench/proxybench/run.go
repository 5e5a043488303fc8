package proxybench

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// Config says what one benchmark run measures. An empty binary path leaves that target
// out.
type Config struct {
	Compass   string // compass-proxy binary
	Squid     string // squid binary
	Tinyproxy string // tinyproxy binary

	AllowlistSize int // entries of the large allowlist policy
	Rounds        int // every rate is measured once per round; the report keeps the median
	Limits        Limits
	Settle        time.Duration // wait before reading memory with the idle tunnels open
	Workloads     Workloads     // which measurements run (profiling one at a time)
	CompassArgs   []string      // further compass-proxy flags
	Dir           string        // scratch directory for configurations and logs
	Progress      io.Writer
}

// Workloads selects measurements; the zero value runs none, AllWorkloads every one.
type Workloads struct {
	Bulk, Setups, Requests, Latency, Idle bool
}

// AllWorkloads runs every measurement.
func AllWorkloads() Workloads { return Workloads{true, true, true, true, true} }

// ParseWorkloads reads a comma-separated list of bulk, setups, requests, latency, idle
// (or "all").
func ParseWorkloads(list string) (Workloads, error) {
	var w Workloads
	for _, name := range strings.Split(list, ",") {
		switch strings.TrimSpace(name) {
		case "all":
			w = AllWorkloads()
		case "bulk":
			w.Bulk = true
		case "setups":
			w.Setups = true
		case "requests":
			w.Requests = true
		case "latency":
			w.Latency = true
		case "idle":
			w.Idle = true
		default:
			return w, fmt.Errorf("proxybench: unknown workload %q (want bulk, setups, requests, latency, idle or all)", name)
		}
	}
	return w, nil
}

// Target names, as printed.
const (
	NameDirect           = "direct"
	NameCompass          = "compass (public)"
	NameCompassAllowlist = "compass (100k allowlist)"
	NameSquid            = "squid"
	NameTinyproxy        = "tinyproxy"
)

// RaiseFileLimit lifts the soft limit on open files to the hard limit: the idle-tunnel
// test holds thousands of sockets on both ends.
func RaiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("proxybench: getrlimit: %w", err)
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("proxybench: setrlimit: %w", err)
	}
	return lim.Cur, nil
}

// Run starts the upstream and every configured proxy, measures them all, stops them and
// returns the report.
func Run(cfg Config) (*Report, error) {
	logf := func(format string, args ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, format+"\n", args...)
		}
	}
	loadBefore := loadAverage()
	up, err := StartUpstream()
	if err != nil {
		return nil, err
	}
	defer up.Close()

	rep := &Report{Values: map[string]Values{}, Errors: map[string]int64{}, Direct: NameDirect}
	targets := []Target{{Name: NameDirect}}
	var procs []*Process
	defer func() {
		for _, p := range procs {
			if err := p.Stop(); err != nil {
				logf("%v", err)
			}
		}
	}()
	add := func(name string, start func() (*Process, error), tree bool) error {
		t0 := time.Now()
		p, err := start()
		if err != nil {
			return err
		}
		procs = append(procs, p)
		pids := func() []int { return []int{p.PID()} }
		if tree {
			pids = func() []int { return ProcessTree(p.PID()) }
		}
		targets = append(targets, Target{Name: name, Proxy: p.Addr, PIDs: pids})
		logf("started %s on %s (pid %d) in %s", name, p.Addr, p.PID(), time.Since(t0).Round(time.Millisecond))
		return nil
	}
	if cfg.Compass != "" {
		if err := add(NameCompass, func() (*Process, error) {
			return StartCompass("compass-public", cfg.Compass, cfg.Dir, []byte(`"public"`), cfg.CompassArgs...)
		}, false); err != nil {
			return nil, err
		}
		rep.Compass = NameCompass
		policyJSON, err := LargeAllowlist(cfg.AllowlistSize, "127.0.0.1/32")
		if err != nil {
			return nil, err
		}
		if err := add(NameCompassAllowlist, func() (*Process, error) {
			return StartCompass("compass-allowlist", cfg.Compass, cfg.Dir, policyJSON, cfg.CompassArgs...)
		}, false); err != nil {
			return nil, err
		}
		rep.CompassAllowlist = NameCompassAllowlist
	}
	if cfg.Squid != "" {
		if err := add(NameSquid, func() (*Process, error) { return StartSquid(cfg.Squid, cfg.Dir) }, true); err != nil {
			return nil, err
		}
		rep.Peers = append(rep.Peers, NameSquid)
	}
	if cfg.Tinyproxy != "" {
		if err := add(NameTinyproxy, func() (*Process, error) { return StartTinyproxy(cfg.Tinyproxy, cfg.Dir) }, true); err != nil {
			return nil, err
		}
		rep.Peers = append(rep.Peers, NameTinyproxy)
	}

	// Each round runs each workload on every target in turn, so that a disturbance of
	// the machine spreads over all of them instead of favouring whichever ran at a quiet
	// moment; each round starts one target further, so none always follows the same
	// neighbour.
	perRound := map[string]*[numMetrics][]float64{}
	samples := map[string][]time.Duration{}
	for _, t := range targets {
		rep.Targets = append(rep.Targets, t.Name)
		perRound[t.Name] = &[numMetrics][]float64{}
	}
	lim, work := cfg.Limits, cfg.Workloads
	rates := []struct {
		name       string
		enabled    bool
		rate, cost Metric
		scale      float64 // operations per second to the rate metric's unit
		cpuUnit    float64 // CPU seconds per operation to the cost metric's unit
		run        func(Target) (Rate, error)
	}{
		{"bulk MB/s", work.Bulk, MetricBulk, MetricBulkCPU, 1e-6, 1e12, func(t Target) (Rate, error) { return Bulk(t, up.StreamAddr(), lim) }},
		{"set-ups/s", work.Setups, MetricSetups, MetricSetupCPU, 1, 1e6, func(t Target) (Rate, error) { return Setups(t, up.StreamAddr(), lim), nil }},
		{"requests/s", work.Requests, MetricRequests, MetricRequestCPU, 1, 1e6, func(t Target) (Rate, error) { return Requests(t, up.HTTPAddr(), lim), nil }},
	}
	for round := 1; round <= cfg.Rounds; round++ {
		order := make([]Target, len(targets))
		for i := range targets {
			order[i] = targets[(i+round-1)%len(targets)]
		}
		for _, w := range rates {
			if !w.enabled {
				continue
			}
			for _, t := range order {
				per := perRound[t.Name]
				var r Rate
				var err error
				cpu := cpuDuring(t, func() { r, err = w.run(t) })
				if err != nil {
					logf("%s: %v", t.Name, err)
					rep.Errors[t.Name]++
				}
				rep.Errors[t.Name] += r.Errors
				line := fmt.Sprintf("round %d  %-26s %-11s %8.0f (%d failed)", round, t.Name, w.name, r.PerSecond()*w.scale, r.Errors)
				if r.Ops > 0 {
					per[w.rate] = append(per[w.rate], r.PerSecond()*w.scale)
					if cpu >= 0 {
						per[w.cost] = append(per[w.cost], cpu.Seconds()*w.cpuUnit/float64(r.Ops))
						line += fmt.Sprintf("  %s %.0f", metricInfos[w.cost].title, last(per[w.cost]))
					}
				}
				logf("%s", line)
			}
		}
		if work.Latency {
			for _, t := range order {
				lat, err := Latencies(t, up.HTTPAddr(), lim)
				if err != nil {
					logf("%s: %v", t.Name, err)
					rep.Errors[t.Name]++
				}
				samples[t.Name] = append(samples[t.Name], lat...)
				logf("round %d  %-26s latency     p50 %v p99 %v", round, t.Name, Percentile(lat, 50).Round(time.Microsecond), Percentile(lat, 99).Round(time.Microsecond))
			}
		}
	}
	for _, t := range targets {
		v := NoValues()
		for m, vals := range perRound[t.Name] {
			v[m] = Median(vals)
		}
		if s := samples[t.Name]; len(s) > 0 {
			v[MetricP50] = float64(Percentile(s, 50)) / float64(time.Microsecond)
			v[MetricP99] = float64(Percentile(s, 99)) / float64(time.Microsecond)
		}
		if work.Idle && !t.Direct() {
			per, opened, err := IdleMemory(t, up.StreamAddr(), lim, cfg.Settle)
			switch {
			case err != nil:
				logf("%s: %v", t.Name, err)
				rep.Errors[t.Name]++
			case opened < lim.IdleTunnels:
				rep.Errors[t.Name] += int64(lim.IdleTunnels - opened)
				fallthrough
			default:
				v[MetricIdleRSS] = per / 1024
				logf("%-26s %d idle tunnels: %.1f KiB each", t.Name, opened, per/1024)
			}
		}
		rep.Values[t.Name] = v
	}
	rep.Notes = append(rep.Notes, fmt.Sprintf(
		"Rates are the median of %d rounds of %s each (concurrency %d); latency percentiles pool %d sequential keep-alive requests per round; memory is the VmRSS growth over %d idle CONNECT tunnels.",
		cfg.Rounds, lim.Duration, lim.Concurrency, lim.LatencyRequests, lim.IdleTunnels))
	rep.Notes = append(rep.Notes, fmt.Sprintf(
		"Machine: %d CPUs; 1-minute load average %s before the run and %s after it. Anything else running competes with the proxies for CPU and shows up as noise in the rates; the CPU-per-operation figures are much less sensitive to it.",
		runtime.NumCPU(), loadBefore, loadAverage()))
	var stopErrs []error
	for _, p := range procs {
		stopErrs = append(stopErrs, p.Stop())
	}
	procs = nil
	return rep, errors.Join(stopErrs...)
}

// loadAverage is the first field of /proc/loadavg, or "?".
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(data)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

func last(vals []float64) float64 { return vals[len(vals)-1] }

// cpuDuring runs fn and returns the CPU time the target's processes used meanwhile, or
// -1 for a direct target or when it cannot be read.
func cpuDuring(t Target, fn func()) time.Duration {
	if t.PIDs == nil {
		fn()
		return -1
	}
	before, err := CPUTime(t.PIDs())
	fn()
	if err != nil {
		return -1
	}
	after, err := CPUTime(t.PIDs())
	if err != nil {
		return -1
	}
	return after - before
}
