// Command compass-proxy is the enforcing sidecar: an HTTP/CONNECT forward proxy and a
// DNS server that enforce one network policy at a time, swapped through an admin API on
// a unix socket. See docs/proxy.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/compass-egress/compass-egress/internal/buildinfo"
	"github.com/compass-egress/compass-egress/internal/jsonlog"
	"github.com/compass-egress/compass-egress/proxy"
)

const envPrefix = "COMPASS_PROXY_"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		os.Exit(healthcheck(os.Args[2:], os.Stderr))
	}
	if len(os.Args) > 1 && (os.Args[1] == "version" || os.Args[1] == "--version") {
		fmt.Println(buildinfo.Version)
		return
	}
	setGCDefault(os.Getenv)
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// gcPercentDefault replaces Go's GOGC=100 unless the operator set GOGC. The proxy's live
// heap is small (a few MB beside the rule set), so at 100 it collects after every few
// hundred requests: a third of its CPU per request and most of its p99 latency went to
// GC in `make bench-proxy`. At 400 the heap may grow to five times the live heap, which
// for a sidecar is a few tens of MB.
const gcPercentDefault = 400

func setGCDefault(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercentDefault)
	}
}

// listFlag is a repeatable flag that also accepts comma-separated values.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*l = append(*l, part)
		}
	}
	return nil
}

// options are the command line; every flag also reads COMPASS_PROXY_<FLAG> (the flag
// wins when both are given).
type options struct {
	cfg           proxy.Config
	upstreams     listFlag
	allowInternal listFlag
	logLevel      string
}

func newFlagSet(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("compass-proxy", flag.ContinueOnError)
	c := &o.cfg
	fs.StringVar(&c.Listen, "listen", ":3128", "address of the HTTP/CONNECT proxy")
	fs.StringVar(&c.DNSListen, "dns-listen", ":53", "address of the DNS server (UDP and TCP); empty disables it")
	fs.Var(&o.upstreams, "dns-upstream", "upstream DNS resolver host:port (repeatable or comma-separated; default: the nameservers of /etc/resolv.conf)")
	fs.StringVar(&c.AdminSocket, "admin-socket", "/run/compass/admin.sock", "unix socket of the admin API")
	fs.StringVar(&c.MetricsListen, "metrics-listen", "", "TCP address of /metrics, /livez and /readyz (also on the admin socket); empty (default) disables it. Never an address the sandbox can reach")
	fs.StringVar(&c.PolicyFile, "policy", "", "initial policy file (JSON or YAML), re-read on SIGHUP; without it the proxy starts as no-network")
	fs.Var(&o.allowInternal, "allow-internal", "CIDR exempt from the internal-address guard (repeatable; for development and tests)")
	fs.StringVar(&c.Task, "task", "", "initial task label of logs")
	fs.StringVar(&c.Phase, "phase", "", "initial phase label of logs")
	fs.BoolVar(&c.RequireNoForwarding, "require-no-forwarding", true, "refuse readiness unless IPv4 and IPv6 forwarding are off")
	fs.DurationVar(&c.HeaderTimeout, "header-timeout", 10*time.Second, "time a client has to send request headers")
	fs.DurationVar(&c.DialTimeout, "dial-timeout", 10*time.Second, "time to connect to a destination (and for its TLS handshake on https:// requests)")
	fs.DurationVar(&c.DNSTimeout, "dns-timeout", 2*time.Second, "time for one upstream DNS exchange")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", 90*time.Second, "idle keep-alive connections (client and upstream) are closed after this")
	fs.DurationVar(&c.TunnelIdleTimeout, "tunnel-idle-timeout", 15*time.Minute, "a CONNECT tunnel or websocket relay with no byte either way for this long is closed")
	fs.IntVar(&c.MaxConnections, "max-connections", 4096, "bound on concurrent client connections; further clients wait in the accept queue (0: unbounded)")
	fs.IntVar(&c.DNSMaxInflight, "dns-max-inflight", 256, "bound on DNS queries being answered at once; a query beyond it gets SERVFAIL")
	fs.IntVar(&c.DNSMaxTCPConns, "dns-max-tcp-connections", 128, "bound on concurrent DNS-over-TCP connections; further ones wait in the accept queue")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", 10*time.Second, "on SIGTERM, time for requests and tunnels to finish before they are cut")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info (every decision), warn (blocked attempts only) or error")
	return fs
}

// parse reads args, then fills every flag not given on the command line from its
// environment variable.
func parse(args []string, env func(string) (string, bool)) (*options, error) {
	o := &options{}
	fs := newFlagSet(o)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("compass-proxy: %w", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("compass-proxy: unexpected argument %q", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		key := envPrefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := env(key); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("compass-proxy: %s: %w", key, err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, cidr := range o.allowInternal {
		p, err := netip.ParsePrefix(cidr)
		if err != nil {
			a, aerr := netip.ParseAddr(cidr)
			if aerr != nil {
				return nil, fmt.Errorf("compass-proxy: --allow-internal %q: not a CIDR or address", cidr)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		o.cfg.AllowInternal = append(o.cfg.AllowInternal, p.Masked())
	}
	o.cfg.DNSUpstreams = o.upstreams
	if len(o.cfg.DNSUpstreams) == 0 {
		o.cfg.DNSUpstreams = resolvConfServers("/etc/resolv.conf")
	}
	return o, nil
}

func run(args []string) error {
	o, err := parse(args, os.LookupEnv)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("compass-proxy: --log-level: %w", err)
	}
	log := slog.New(jsonlog.NewHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	o.cfg.Logger = log
	srv, err := proxy.New(o.cfg)
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		return err
	}
	log.Info("compass-proxy started", "version", buildinfo.Version, "listen", srv.ProxyAddr().String(),
		"dns_listen", o.cfg.DNSListen, "dns_upstreams", o.cfg.DNSUpstreams, "admin_socket", o.cfg.AdminSocket,
		"metrics_listen", o.cfg.MetricsListen, "generation", srv.Current().Generation, "mode", string(srv.Current().Mode()))

	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	for sig := range signals {
		if sig == syscall.SIGHUP {
			_ = srv.Reload()
			continue
		}
		log.Info("draining", "signal", sig.String(), "drain_timeout", o.cfg.DrainTimeout.String())
		ctx, cancel := context.WithTimeout(context.Background(), o.cfg.DrainTimeout)
		err := srv.Shutdown(ctx)
		cancel()
		log.Info("stopped")
		return err
	}
	return nil
}

// resolvConfServers are the nameservers of a resolv.conf, as host:53.
func resolvConfServers(path string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) >= 2 && fields[0] == "nameserver" {
			if a, err := netip.ParseAddr(fields[1]); err == nil {
				out = append(out, netip.AddrPortFrom(a, 53).String())
			}
		}
	}
	return out
}

func healthcheck(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("admin-socket", "/run/compass/admin.sock", "unix socket of the admin API")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if !isFlagGiven(fs, "admin-socket") {
		if v, ok := os.LookupEnv(envPrefix + "ADMIN_SOCKET"); ok {
			*socket = v
		}
	}
	if err := proxy.Healthcheck(context.Background(), *socket); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

func isFlagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}
