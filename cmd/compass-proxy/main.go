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
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	// The image is FROM scratch, with no CA bundle: https:// upstreams (absolute-URI
	// requests) are verified against these roots unless SSL_CERT_FILE or SSL_CERT_DIR
	// name a bundle, which then replaces them.
	_ "golang.org/x/crypto/x509roots/fallback"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/internal/buildinfo"
	"github.com/compass-egress/compass-egress/internal/jsonlog"
	"github.com/compass-egress/compass-egress/net/dnsaddr"
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
	err := run(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		usage(os.Stdout)
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// usage is the answer to -h/--help: the subcommands, the variable rule and every flag
// with its default.
func usage(w io.Writer) {
	fmt.Fprint(w, `Usage:
  compass-proxy [flags]                            run the sidecar
  compass-proxy healthcheck [--admin-socket PATH]  exit 0 iff /readyz on the admin socket answers 200
  compass-proxy version                            print the version

Every flag can also be set as COMPASS_PROXY_<FLAG> (upper case, "-" becomes "_"), e.g.
COMPASS_PROXY_DNS_UPSTREAM=10.0.0.2:53,10.0.0.3:53; a flag on the command line wins over
its variable. Repeatable flags take a comma-separated list. See docs/proxy.md.

Flags:
`)
	fs := newFlagSet(&options{})
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// gcPercentDefault replaces Go's GOGC=100 unless the operator set GOGC. The proxy's live
// heap is small (a few MB beside the rule set), so at 100 it collects after every few
// hundred requests: a third of its CPU per request and most of its p99 latency went to
// GC in `make bench-proxy`. At 400 the heap may grow to five times the live heap, which
// for a sidecar is a few tens of MB.
const gcPercentDefault = 400

// Allowed-decision lines are batched (jsonlog.BufferedWriter) rather than written one
// system call each; denied ones and errors are written at once (jsonlog's handler
// flushes after WARN). maxLogFlush bounds what a process killed outright (a panic, the
// controller's forced removal at an environment's close) can lose of its INFO lines;
// logBatchBytes is about 150 lines, so a burst of decisions is written in few calls
// long before the interval ends.
const (
	maxLogFlush   = 10 * time.Second
	logBatchBytes = 64 << 10
)

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
	level         slog.Level // logLevel, parsed
	logFlush      time.Duration
	// source names where each flag given came from, "--name" or its variable, so an
	// error names what the operator actually wrote.
	source map[string]string
}

// from is where flag name's value came from (its flag when it kept its default).
func (o *options) from(name string) string {
	if s, ok := o.source[name]; ok {
		return s
	}
	return "--" + name
}

func envKey(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

func newFlagSet(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("compass-proxy", flag.ContinueOnError)
	c := &o.cfg
	fs.StringVar(&c.Listen, "listen", ":3128", "address of the HTTP/CONNECT proxy")
	fs.StringVar(&c.DNSListen, "dns-listen", ":53", "address of the DNS server (UDP and TCP); empty disables it")
	fs.Var(&o.upstreams, "dns-upstream", "upstream DNS resolver, an IP address with an optional port (default 53); repeatable or comma-separated (default: the nameservers of /etc/resolv.conf)")
	fs.StringVar(&c.AdminSocket, "admin-socket", "/run/compass/admin.sock", "unix socket of the admin API; only a stale socket at the path is replaced")
	fs.StringVar(&c.MetricsListen, "metrics-listen", "", "TCP address of /metrics, /livez and /readyz (also on the admin socket); empty (default) disables it. Never an address the sandbox can reach")
	fs.StringVar(&c.TransparentListen, "transparent-listen", "", "TCP address of the transparent listener, which takes the connections the sidecar's nftables table redirects (the controller passes :15001); empty (default) disables it")
	fs.StringVar(&c.PolicyFile, "policy", "", "initial policy file (JSON or YAML), re-read on SIGHUP; without it the proxy starts as no-network")
	fs.Var(&o.allowInternal, "allow-internal", "CIDR exempt from the internal-address guard (repeatable; for development and tests)")
	fs.StringVar(&c.Task, "task", "", "initial task label of logs")
	fs.StringVar(&c.Phase, "phase", "", "initial phase label of logs")
	fs.BoolVar(&c.RequireNoForwarding, "require-no-forwarding", true, "refuse readiness unless IPv4 (globally and on every interface) and IPv6 forwarding are off")
	fs.BoolVar(&c.DenyPrivate, "deny-private", false, "refuse private-use addresses (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7) unless an allowlist's IP/CIDR rule inside them allows one")
	fs.DurationVar(&c.HeaderTimeout, "header-timeout", 10*time.Second, "time a client has to send request headers; also bounds writing the proxy's last answers (a 400, a refused or failed CONNECT) to a client that reads nothing")
	fs.DurationVar(&c.DialTimeout, "dial-timeout", 10*time.Second, "time to connect to one address of a destination, each address tried in turn (and for the TLS handshake on https:// requests)")
	fs.DurationVar(&c.DNSTimeout, "dns-timeout", 2*time.Second, "time for one upstream DNS exchange")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", 90*time.Second, "idle keep-alive connections (client and upstream) are closed after this")
	fs.DurationVar(&c.TunnelIdleTimeout, "tunnel-idle-timeout", 15*time.Minute, "a CONNECT tunnel or websocket relay with no byte either way for this long is closed; a forwarded HTTP request ends when its client sends nothing of its body, its upstream takes nothing of that body (504) or sends nothing of its answer head (504) or body, or its client reads nothing of the answer, for this long")
	fs.IntVar(&c.MaxConnections, "max-connections", 4096, "bound on concurrent client connections; further clients wait in the accept queue (0: unbounded)")
	fs.IntVar(&c.DNSMaxInflight, "dns-max-inflight", 256, "bound on DNS queries being answered at once (at least 1); a query beyond it gets SERVFAIL")
	fs.IntVar(&c.DNSMaxTCPConns, "dns-max-tcp-connections", 128, "bound on concurrent DNS-over-TCP connections (at least 1); further ones wait in the accept queue")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", 10*time.Second, "on SIGTERM or SIGINT, time for requests and tunnels to finish before they are cut")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info (every decision), warn (blocked attempts only) or error")
	fs.DurationVar(&o.logFlush, "log-flush-interval", 100*time.Millisecond, "INFO log lines (allowed decisions) are written in batches at most this long after the first of each batch; WARN and above (denied decisions, errors) at once; 0 writes each line as it is logged")
	return fs
}

// parse reads args, then fills every flag not given on the command line from its
// environment variable, then checks the values; with no upstream given it reads the
// nameservers of resolvConf.
func parse(args []string, env func(string) (string, bool), resolvConf string) (*options, error) {
	o := &options{source: map[string]string{}}
	fs := newFlagSet(o)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("compass-proxy: %w (see --help)", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("compass-proxy: unexpected argument %q", fs.Arg(0))
	}
	fs.Visit(func(f *flag.Flag) { o.source[f.Name] = "--" + f.Name })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if _, given := o.source[f.Name]; given {
			return
		}
		key := envKey(f.Name)
		if v, ok := env(key); ok {
			o.source[f.Name] = key
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("compass-proxy: %s: %w", key, err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := o.check(resolvConf); err != nil {
		return nil, err
	}
	return o, nil
}

// check validates the values and derives the rest of cfg: every error names the flag or
// variable it came from, its value and the rule.
func (o *options) check(resolvConf string) error {
	var errs []error
	fail := func(name, format string, a ...any) {
		errs = append(errs, fmt.Errorf("compass-proxy: %s: "+format, append([]any{o.from(name)}, a...)...))
	}
	c := &o.cfg
	// An empty --listen would bind every interface on a random port.
	if c.Listen == "" {
		fail("listen", "empty: the proxy needs an address, e.g. :3128")
	}
	if c.AdminSocket == "" {
		fail("admin-socket", "empty: the admin API needs a unix socket path")
	}
	// Zero is refused rather than read as the default, so that no value silently means
	// another; proxy.Config gives zero its default only for Go callers.
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"header-timeout", c.HeaderTimeout}, {"dial-timeout", c.DialTimeout}, {"dns-timeout", c.DNSTimeout},
		{"idle-timeout", c.IdleTimeout}, {"tunnel-idle-timeout", c.TunnelIdleTimeout}, {"drain-timeout", c.DrainTimeout},
	} {
		if d.v <= 0 {
			fail(d.name, "%s: must be positive", d.v)
		}
	}
	if c.MaxConnections < 0 {
		fail("max-connections", "%d: must not be negative (0: unbounded)", c.MaxConnections)
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"dns-max-inflight", c.DNSMaxInflight}, {"dns-max-tcp-connections", c.DNSMaxTCPConns}} {
		if n.v <= 0 {
			fail(n.name, "%d: must be positive", n.v)
		}
	}
	if err := o.level.UnmarshalText([]byte(o.logLevel)); err != nil {
		fail("log-level", "%q: want debug, info, warn or error", o.logLevel)
	}
	// The bound is what a process killed outright may lose of its decision log.
	if o.logFlush < 0 || o.logFlush > maxLogFlush {
		fail("log-flush-interval", "%s: must be between 0 and %s", o.logFlush, maxLogFlush)
	}
	for _, cidr := range o.allowInternal {
		p, err := netip.ParsePrefix(cidr)
		if err != nil {
			a, aerr := netip.ParseAddr(cidr)
			if aerr != nil {
				fail("allow-internal", "%q: not a CIDR or address", cidr)
				continue
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		c.AllowInternal = append(c.AllowInternal, p.Masked())
	}
	for _, u := range o.upstreams {
		addr, err := dnsaddr.ParseUpstream(u)
		if err != nil {
			fail("dns-upstream", "%q: %v", u, err)
			continue
		}
		c.DNSUpstreams = append(c.DNSUpstreams, addr)
	}
	_, given := o.source["dns-upstream"]
	if len(o.upstreams) == 0 && given {
		// Given but empty (an unset shell variable, say) is not the default.
		fail("dns-upstream", "empty: want an IP address with an optional port, or leave it out to use %s", resolvConf)
	}
	if len(o.upstreams) == 0 && !given {
		c.DNSUpstreams = resolvConfServers(resolvConf)
		// Refused rather than warned about: the proxy would start, report ready and then
		// fail every name lookup, the sandbox's and its own, behind whatever policy the
		// controller swaps in later, where a start-up log line is long forgotten.
		if len(c.DNSUpstreams) == 0 {
			errs = append(errs, fmt.Errorf("compass-proxy: no DNS upstream: neither --dns-upstream nor %s is set and %s names no nameserver, so every name lookup would fail", envKey("dns-upstream"), resolvConf))
		}
	}
	return errors.Join(errs...)
}

// run installs the signal handlers first, so that a SIGHUP or SIGTERM during start-up is
// neither fatal (SIGHUP's default action kills) nor lost: serve handles it once the
// proxy is up.
//
// SIGHUP and the stop signals are caught on channels of their own: signal.Notify drops a
// signal its channel has no room for, and SIGHUPs sent during a slow reload used to fill
// a shared channel and crowd out the SIGTERM after them. A SIGHUP dropped while another
// waits loses nothing: the waiting reload reads the file as it is then.
func run(args []string) error {
	hups, stops := make(chan os.Signal, 1), make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	signal.Notify(stops, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(hups)
	defer signal.Stop(stops)
	signals, done := make(chan os.Signal), make(chan struct{})
	defer close(done)
	go func() {
		for {
			var sig os.Signal
			select {
			case sig = <-hups:
			case sig = <-stops:
			case <-done:
				return
			}
			select {
			case signals <- sig:
			case <-done:
				return
			}
		}
	}()
	o, err := parse(args, os.LookupEnv, "/etc/resolv.conf")
	if err != nil {
		return err
	}
	return serve(o, os.Stderr, signals)
}

// serve runs the proxy until SIGTERM or SIGINT, then drains. A SIGHUP re-reads --policy,
// including one that came during start-up: the file may have changed after New read it.
func serve(o *options, logOut io.Writer, signals <-chan os.Signal) error {
	var bw *jsonlog.BufferedWriter
	if o.logFlush > 0 {
		bw = jsonlog.NewBufferedWriter(logOut, o.logFlush, logBatchBytes)
		defer bw.Close()
		logOut = bw
	}
	log := slog.New(jsonlog.NewHandler(logOut, &slog.HandlerOptions{Level: o.level}))
	o.cfg.Logger = log
	srv, err := proxy.New(o.cfg)
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		return err
	}
	// The bound addresses, not the flags: a port of 0 is chosen only now.
	log.Info("compass-proxy started", "version", buildinfo.Version, "listen", srv.ProxyAddr().String(),
		"dns_listen", boundAddr(srv.DNSAddr()), "dns_upstreams", o.cfg.DNSUpstreams, "admin_socket", o.cfg.AdminSocket,
		"metrics_listen", boundAddr(srv.MetricsAddr()), "generation", srv.Current().Generation, "mode", string(srv.Current().Mode()))

	for sig := range signals {
		if sig == syscall.SIGHUP {
			_ = srv.Reload()
			continue
		}
		// From here every line is written at once: whoever sent the signal may kill the
		// proxy when its grace ends (docker stop), and no batched line may be lost then.
		if bw != nil {
			_ = bw.Close()
		}
		log.Info("draining", "signal", sig.String(), "drain_timeout", srv.DrainTimeout().String())
		ctx, cancel := context.WithTimeout(context.Background(), srv.DrainTimeout())
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
	// The image's HEALTHCHECK gives the check 3 s: a sidecar that has not answered by
	// then fails it with a reason.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := adminapi.NewClient(*socket, nil).Ready(ctx); err != nil {
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

// boundAddr is a listener's address, "" for one turned off.
func boundAddr(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}
