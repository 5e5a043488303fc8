package proxybench

import (
	"errors"
	"fmt"
	"io"
	"math"
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
	Dir           string        // scratch directory for configurations and logs
	Progress      io.Writer
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
			return StartCompass("compass-public", cfg.Compass, cfg.Dir, []byte(`"public"`))
		}, false); err != nil {
			return nil, err
		}
		rep.Compass = NameCompass
		policyJSON, err := LargeAllowlist(cfg.AllowlistSize, "127.0.0.1/32")
		if err != nil {
			return nil, err
		}
		if err := add(NameCompassAllowlist, func() (*Process, error) {
			return StartCompass("compass-allowlist", cfg.Compass, cfg.Dir, policyJSON)
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

	// Every round measures every target in turn, so that a disturbance of the machine
	// spreads over all of them instead of favouring whichever ran at a quiet moment.
	rounds := map[string]*[3][]float64{}
	samples := map[string][]time.Duration{}
	for _, t := range targets {
		rep.Targets = append(rep.Targets, t.Name)
		rounds[t.Name] = &[3][]float64{}
	}
	lim := cfg.Limits
	for round := 1; round <= cfg.Rounds; round++ {
		for _, t := range targets {
			per := rounds[t.Name]
			bulk, err := Bulk(t, up.StreamAddr(), lim)
			if err != nil {
				logf("%s: %v", t.Name, err)
				rep.Errors[t.Name]++
			} else {
				per[0] = append(per[0], float64(bulk.Ops)/1e6/bulk.Elapsed.Seconds())
			}
			setups := Setups(t, up.StreamAddr(), lim)
			per[1] = append(per[1], setups.PerSecond())
			rep.Errors[t.Name] += setups.Errors
			reqs := Requests(t, up.HTTPAddr(), lim)
			per[2] = append(per[2], reqs.PerSecond())
			rep.Errors[t.Name] += reqs.Errors
			lat, err := Latencies(t, up.HTTPAddr(), lim)
			if err != nil {
				logf("%s: %v", t.Name, err)
				rep.Errors[t.Name]++
			}
			samples[t.Name] = append(samples[t.Name], lat...)
			logf("round %d %-26s bulk %8.0f MB/s  set-ups %7.0f/s (%d failed)  requests %7.0f/s (%d failed)  p50 %v",
				round, t.Name, last(per[0]), setups.PerSecond(), setups.Errors, reqs.PerSecond(), reqs.Errors, Percentile(lat, 50))
		}
	}
	for _, t := range targets {
		v := NoValues()
		per := rounds[t.Name]
		v[MetricBulk], v[MetricSetups], v[MetricRequests] = Median(per[0]), Median(per[1]), Median(per[2])
		if s := samples[t.Name]; len(s) > 0 {
			v[MetricP50] = float64(Percentile(s, 50)) / float64(time.Microsecond)
			v[MetricP99] = float64(Percentile(s, 99)) / float64(time.Microsecond)
		}
		if !t.Direct() {
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
	var stopErrs []error
	for _, p := range procs {
		stopErrs = append(stopErrs, p.Stop())
	}
	procs = nil
	return rep, errors.Join(stopErrs...)
}

func last(vals []float64) float64 {
	if len(vals) == 0 {
		return math.NaN()
	}
	return vals[len(vals)-1]
}
