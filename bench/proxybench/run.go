package proxybench

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strings"
	"time"
)

// Config says what one benchmark run measures. An empty binary path leaves that target
// out.
type Config struct {
	Compass   string // compass-proxy binary
	Squid     string // squid binary
	Tinyproxy string // tinyproxy binary
	// SquidWorkers is squid's workers directive: 1, its default, serves every
	// connection in one process, which uses at most one CPU.
	SquidWorkers int

	AllowlistSize int // entries of the large allowlist policy
	Rounds        int // every rate is measured once per round; the report keeps the median
	Limits        Limits
	Settle        time.Duration // wait before reading memory with the idle tunnels open
	Workloads     Workloads     // which measurements run (profiling one at a time)
	CompassArgs   []string      // further compass-proxy flags
	// Transparent adds compass-proxy's transparent and explicit paths in network
	// namespaces the run creates (needs root; see Sandbox).
	Transparent bool
	Dir         string // scratch directory for configurations and logs
	Progress    io.Writer
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
	NameExplicit         = "compass explicit (netns)"
	NameTransparent      = "compass transparent (netns)"
)

// skippedNeedsRoot is what the report says of the namespace paths in a run without root.
const skippedNeedsRoot = "skipped: needs root"

// Run starts the upstream and every configured proxy, measures them all, stops them and
// returns the report.
func Run(cfg Config) (*Report, error) {
	loadBefore := loadAverage()
	up, err := StartUpstream()
	if err != nil {
		return nil, err
	}
	defer up.Close()
	b := &bench{
		cfg:     cfg,
		up:      up,
		rep:     &Report{Values: map[string]Values{}, PerRound: map[string]*RoundValues{}, Errors: map[string]int64{}, Direct: NameDirect},
		targets: []Target{{Name: NameDirect}},
		samples: map[string][]time.Duration{},
		idle:    map[string]float64{},
	}
	defer b.stopAll()
	b.waitForTimeWait()
	if err := b.startProxies(); err != nil {
		return nil, err
	}
	if cfg.Workloads.Idle {
		b.measureIdle()
	}
	for round := 1; round <= cfg.Rounds; round++ {
		b.round(round)
	}
	b.summarise()
	lim := cfg.Limits
	b.rep.Notes = append(b.rep.Notes, fmt.Sprintf(
		"Rates are the median of %d rounds of %s each (concurrency %d); latency percentiles pool %d sequential keep-alive requests per round; memory is the VmRSS growth over %d idle CONNECT tunnels, opened first on each freshly started proxy.",
		cfg.Rounds, lim.Duration, lim.Concurrency, lim.LatencyRequests, lim.IdleTunnels))
	b.rep.Notes = append(b.rep.Notes, fmt.Sprintf(
		"Machine: %d CPUs; 1-minute load average %s before the run and %s after it. Anything else running competes with the proxies for CPU and shows up as noise in the rates; the CPU-per-operation figures are much less sensitive to it.",
		runtime.NumCPU(), loadBefore, loadAverage()))
	return b.rep, b.stopAll()
}

// bench is one run in progress.
type bench struct {
	cfg     Config
	up      *Upstream
	rep     *Report
	targets []Target
	procs   []*Process
	sandbox *Sandbox

	samples map[string][]time.Duration // per target, every latency sample
	idle    map[string]float64         // per proxy, KiB per idle tunnel
}

func (b *bench) logf(format string, args ...any) {
	if b.cfg.Progress != nil {
		fmt.Fprintf(b.cfg.Progress, format+"\n", args...)
	}
}

// Sockets an earlier run left in TIME_WAIT hold ephemeral ports for a minute; with
// many of them, connections of the set-ups workload fail to find a port and its rates
// drop (seen at 118 000 after runs back to back). A run waits, up to timeWaitMaxWait,
// for their number to fall to timeWaitQuiet.
const (
	timeWaitQuiet   = 20000
	timeWaitMaxWait = 70 * time.Second
)

// waitForTimeWait waits for the TIME_WAIT sockets of earlier runs to expire, and notes
// in the report when it gave up.
func (b *bench) waitForTimeWait() {
	tw, err := timeWaitSockets()
	if err != nil || tw <= timeWaitQuiet {
		return
	}
	b.logf("waiting for %d sockets in TIME_WAIT (earlier runs) to expire", tw)
	for stop := time.Now().Add(timeWaitMaxWait); time.Now().Before(stop); {
		time.Sleep(time.Second)
		if tw, err = timeWaitSockets(); err != nil || tw <= timeWaitQuiet {
			return
		}
	}
	b.rep.Notes = append(b.rep.Notes, fmt.Sprintf("%d sockets were still in TIME_WAIT when the run started; set-ups may have failed for want of ephemeral ports (see failed ops).", tw))
}

// startProxies starts every configured proxy and adds it to the targets.
func (b *bench) startProxies() error {
	cfg := b.cfg
	type proxy struct {
		name  string
		start func() (*Process, error)
		tree  bool // memory and CPU are the sum over the process and its children
	}
	var proxies []proxy
	if cfg.Compass != "" {
		policyJSON, err := LargeAllowlist(cfg.AllowlistSize, "127.0.0.1/32")
		if err != nil {
			return err
		}
		proxies = append(proxies,
			proxy{NameCompass, func() (*Process, error) {
				return StartCompass("compass-public", cfg.Compass, cfg.Dir, []byte(`"public"`), cfg.CompassArgs...)
			}, false},
			proxy{NameCompassAllowlist, func() (*Process, error) {
				return StartCompass("compass-allowlist", cfg.Compass, cfg.Dir, policyJSON, cfg.CompassArgs...)
			}, false})
		b.rep.Compass, b.rep.CompassAllowlist = NameCompass, NameCompassAllowlist
	}
	if cfg.Squid != "" {
		proxies = append(proxies, proxy{NameSquid, func() (*Process, error) { return StartSquid(cfg.Squid, cfg.Dir, cfg.SquidWorkers) }, true})
		b.rep.Peers = append(b.rep.Peers, NameSquid)
	}
	if cfg.Tinyproxy != "" {
		proxies = append(proxies, proxy{NameTinyproxy, func() (*Process, error) { return StartTinyproxy(cfg.Tinyproxy, cfg.Dir) }, true})
		b.rep.Peers = append(b.rep.Peers, NameTinyproxy)
	}
	for _, px := range proxies {
		t0 := time.Now()
		p, err := px.start()
		if err != nil {
			return err
		}
		b.procs = append(b.procs, p)
		pids := func() []int { return []int{p.PID()} }
		if px.tree {
			pids = func() []int { return ProcessTree(p.PID()) }
		}
		b.targets = append(b.targets, Target{Name: px.name, Proxy: p.Addr, PIDs: pids})
		b.logf("started %s on %s (pid %d) in %s", px.name, p.Addr, p.PID(), time.Since(t0).Round(time.Millisecond))
	}
	if cfg.Compass != "" {
		if err := b.checkAllowlistEnforced(); err != nil {
			return err
		}
	}
	for _, t := range b.targets {
		b.rep.Targets = append(b.rep.Targets, t.Name)
		b.rep.PerRound[t.Name] = &RoundValues{}
	}
	if cfg.Compass != "" && cfg.Transparent {
		return b.startSandbox()
	}
	return nil
}

// startSandbox adds the explicit and transparent paths of a compass-proxy in network
// namespaces, or, without root, names them in the report as skipped.
func (b *bench) startSandbox() error {
	b.rep.Explicit, b.rep.Transparent = NameExplicit, NameTransparent
	b.rep.Targets = append(b.rep.Targets, NameExplicit, NameTransparent)
	if os.Geteuid() != 0 {
		b.rep.Skipped = map[string]string{NameExplicit: skippedNeedsRoot, NameTransparent: skippedNeedsRoot}
		b.logf("%s and %s: %s (network namespaces, links, nftables)", NameExplicit, NameTransparent, skippedNeedsRoot)
		return nil
	}
	t0 := time.Now()
	sb, err := StartSandbox(b.cfg.Compass, b.cfg.Dir, b.cfg.CompassArgs...)
	if err != nil {
		return err
	}
	b.sandbox = sb
	e, tr := sb.Targets(NameExplicit, NameTransparent)
	b.targets = append(b.targets, e, tr)
	for _, t := range []Target{e, tr} {
		b.rep.PerRound[t.Name] = &RoundValues{}
	}
	b.logf("started compass-proxy in namespace %s (pid %d; explicit %s, transparent :%d; upstream %s) in %s",
		sb.sidecar.Name, sb.proxy.PID(), sb.proxy.Addr, transparentPort, sb.Upstream.StreamAddr(), time.Since(t0).Round(time.Millisecond))
	return nil
}

// upstream is the upstream t reaches.
func (b *bench) upstream(t Target) *Upstream {
	if t.Upstream != nil {
		return t.Upstream
	}
	return b.up
}

// checkAllowlistEnforced makes sure the allowlist proxy measures what it claims to: a
// tunnel to an address its one loopback rule does not cover must be refused.
func (b *bench) checkAllowlistEnforced() error {
	for _, t := range b.targets {
		if t.Name != NameCompassAllowlist {
			continue
		}
		_, port, _ := strings.Cut(b.up.StreamAddr(), ":")
		c, _, err := dialTunnel(t, "127.0.0.2:"+port)
		if err == nil {
			c.Close()
			return fmt.Errorf("proxybench: %s let a tunnel to 127.0.0.2 through: the allowlist is not in force", t.Name)
		}
		b.logf("%s refuses what its allowlist leaves out: %v", t.Name, err)
	}
	return nil
}

// stopAll stops every proxy still running.
func (b *bench) stopAll() error {
	var errs []error
	for _, p := range b.procs {
		errs = append(errs, p.Stop())
	}
	b.procs = nil
	if b.sandbox != nil {
		errs = append(errs, b.sandbox.Close())
		b.sandbox = nil
	}
	return errors.Join(errs...)
}

// rateWorkload is a measurement that yields a rate and, for a proxy, a CPU cost.
type rateWorkload struct {
	name       string
	rate, cost Metric
	scale      float64 // operations per second to the rate metric's unit
	cpuUnit    float64 // CPU seconds per operation to the cost metric's unit
	run        func(Target) (Rate, error)
}

// round runs each workload on every target in turn, so that a disturbance of the machine
// spreads over all of them instead of favouring whichever ran at a quiet moment, in an
// order that changes from round to round so that no target always runs right after the
// same neighbour (roundOrder).
func (b *bench) round(round int) {
	lim, work := b.cfg.Limits, b.cfg.Workloads
	order := make([]Target, len(b.targets))
	for i, j := range roundOrder(len(b.targets), round) {
		order[i] = b.targets[j]
	}
	var rates []rateWorkload
	if work.Bulk {
		rates = append(rates, rateWorkload{"bulk MB/s", MetricBulk, MetricBulkCPU, 1e-6, 1e12,
			func(t Target) (Rate, error) { return Bulk(t, b.upstream(t).StreamAddr(), lim) }})
	}
	if work.Setups {
		rates = append(rates, rateWorkload{"set-ups/s", MetricSetups, MetricSetupCPU, 1, 1e6,
			func(t Target) (Rate, error) { return Setups(t, b.upstream(t).StreamAddr(), lim), nil }})
	}
	if work.Requests {
		rates = append(rates, rateWorkload{"requests/s", MetricRequests, MetricRequestCPU, 1, 1e6,
			func(t Target) (Rate, error) { return Requests(t, b.upstream(t).HTTPAddr(), lim), nil }})
	}
	for _, w := range rates {
		for _, t := range order {
			b.measureRate(round, t, w)
		}
	}
	if work.Latency {
		for _, t := range order {
			lat, err := Latencies(t, b.upstream(t).HTTPAddr(), lim)
			if err != nil {
				b.logf("%s: %v", t.Name, err)
				b.rep.Errors[t.Name]++
			}
			b.samples[t.Name] = append(b.samples[t.Name], lat...)
			per := b.rep.PerRound[t.Name]
			p50, p99 := math.NaN(), math.NaN()
			if len(lat) > 0 {
				p50 = float64(Percentile(lat, 50)) / float64(time.Microsecond)
				p99 = float64(Percentile(lat, 99)) / float64(time.Microsecond)
			}
			per[MetricP50] = append(per[MetricP50], p50)
			per[MetricP99] = append(per[MetricP99], p99)
			b.logf("round %d  %-26s latency     p50 %v p99 %v", round, t.Name, Percentile(lat, 50).Round(time.Microsecond), Percentile(lat, 99).Round(time.Microsecond))
		}
	}
}

func (b *bench) measureRate(round int, t Target, w rateWorkload) {
	per := b.rep.PerRound[t.Name]
	var r Rate
	var err error
	cpu := cpuDuring(t, func() { r, err = w.run(t) })
	if err != nil {
		b.logf("%s: %v", t.Name, err)
		b.rep.Errors[t.Name]++
	}
	b.rep.Errors[t.Name] += r.Errors
	line := fmt.Sprintf("round %d  %-26s %-11s %8.0f (%d failed)", round, t.Name, w.name, r.PerSecond()*w.scale, r.Errors)
	// Every round appends one value, NaN when nothing was measured, so that index i is
	// round i+1 for every target and the report can pair two targets' rounds.
	rate, cost := math.NaN(), math.NaN()
	if r.Ops > 0 {
		rate = r.PerSecond() * w.scale
		if cpu >= 0 {
			cost = cpu.Seconds() * w.cpuUnit / float64(r.Ops)
			line += fmt.Sprintf("  %s %.0f", metricInfos[w.cost].title, cost)
		}
	}
	per[w.rate] = append(per[w.rate], rate)
	per[w.cost] = append(per[w.cost], cost)
	b.logf("%s", line)
}

// measureIdle measures each proxy's memory per idle tunnel before anything else runs
// through it. It needs no rounds (it is a difference of two readings on a quiet
// proxy), and a fresh process is the case that costs most: a Go proxy that has done
// other work first reuses the memory that work freed.
func (b *bench) measureIdle() {
	lim := b.cfg.Limits
	for _, t := range b.targets {
		if t.Direct() || t.Enter != nil {
			// The namespace paths share one process, measured through both.
			continue
		}
		per, opened, err := IdleMemory(t, b.up.StreamAddr(), lim, b.cfg.Settle)
		switch {
		case err != nil:
			b.logf("%s: %v", t.Name, err)
			b.rep.Errors[t.Name]++
		case opened < lim.IdleTunnels:
			// A figure over fewer tunnels is not the one the target is about, and
			// the growth per tunnel depends on their number: report none.
			b.rep.Errors[t.Name] += int64(lim.IdleTunnels - opened)
			b.rep.Notes = append(b.rep.Notes, fmt.Sprintf("%s opened %d of %d idle tunnels; its memory per idle tunnel (%.1f KiB over those) is left out.",
				t.Name, opened, lim.IdleTunnels, per/1024))
			b.logf("%-26s only %d of %d idle tunnels: %.1f KiB each, left out", t.Name, opened, lim.IdleTunnels, per/1024)
		default:
			b.idle[t.Name] = per / 1024
			b.logf("%-26s %d idle tunnels: %.1f KiB each", t.Name, opened, per/1024)
		}
	}
}

// summarise turns the rounds into the report's values.
func (b *bench) summarise() {
	for _, t := range b.targets {
		v := NoValues()
		for m, vals := range b.rep.PerRound[t.Name] {
			v[m] = Median(vals)
		}
		// Latency percentiles pool every round's samples instead of taking the median of
		// the rounds' percentiles, which stay in PerRound for the spread of the ratios.
		if s := b.samples[t.Name]; len(s) > 0 {
			v[MetricP50] = float64(Percentile(s, 50)) / float64(time.Microsecond)
			v[MetricP99] = float64(Percentile(s, 99)) / float64(time.Microsecond)
			// The run's notes say how many requests a round pools; a target that hit the
			// time bound (or an error) took fewer, and its slow rounds weigh less.
			if want := b.cfg.Rounds * b.cfg.Limits.LatencyRequests; len(s) < want {
				b.rep.Notes = append(b.rep.Notes, fmt.Sprintf(
					"%s: %d latency samples of %d; rounds that reached the %s bound or failed took fewer, so its pooled percentiles weigh its slower rounds less than those of a target that took them all.",
					t.Name, len(s), want, b.cfg.Limits.Duration))
			}
		}
		if kib, ok := b.idle[t.Name]; ok {
			v[MetricIdleRSS] = kib
		}
		b.rep.Values[t.Name] = v
	}
}

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
