// Package proxy is compass-proxy, the enforcing sidecar: an HTTP forward proxy with
// CONNECT tunnels (on goproxy) and a DNS server (on miekg/dns) that enforce one network
// policy at a time, swap it atomically through an admin API on a unix socket, and log
// and count every decision.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/elazarl/goproxy"
	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/net/addrguard"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/proxy/connio"
	"github.com/compass-egress/compass-egress/proxy/dnsserver"
	"github.com/compass-egress/compass-egress/proxy/dnsupstream"
	"github.com/compass-egress/compass-egress/proxy/fqdncache"
	"github.com/compass-egress/compass-egress/proxy/httpfront"
	"github.com/compass-egress/compass-egress/proxy/procnet"
	"github.com/compass-egress/compass-egress/proxy/transparent"
)

// Config is everything the sidecar needs; cmd/compass-proxy fills it from flags.
type Config struct {
	Listen        string // proxy address, e.g. ":3128"
	DNSListen     string // DNS address (UDP and TCP); "" disables
	MetricsListen string // /metrics, /livez, /readyz; "" disables
	// TransparentListen is the transparent listener's address (redirected connections,
	// see proxy/transparent); "" disables it.
	TransparentListen string
	AdminSocket       string // unix socket of the admin API
	DNSUpstreams      []string
	PolicyFile        string // initial policy, re-read by Reload; "" starts as no-network
	AllowInternal     []netip.Prefix
	Task, Phase       string
	// RequireNoForwarding refuses readiness unless IPv4 and IPv6 forwarding are off.
	RequireNoForwarding bool
	// ProcRoot is "/proc" unless tests say otherwise: the forwarding sysctls and the
	// routes, whose gateways the guard refuses, are read below it.
	ProcRoot string

	// The durations and the DNS bounds below take their default when zero (the zero
	// Config is usable); New rejects a negative one. cmd/compass-proxy never passes a zero:
	// it rejects one, so a flag cannot silently mean its default.
	HeaderTimeout time.Duration // 0: 10s
	DialTimeout   time.Duration // 0: 10s
	DNSTimeout    time.Duration // 0: 2s
	IdleTimeout   time.Duration // 0: 90s
	// TunnelIdleTimeout closes a CONNECT tunnel or websocket relay that carried no byte in
	// either direction for this long (see connio.IdleClock), and ends a forwarded HTTP request
	// that moved no byte for this long: a request body the client stopped sending or the
	// upstream stopped taking (504), an answer head (504) or body the upstream stopped
	// sending, an answer the client stopped reading (see httpfront's clientReader, upclient,
	// connio.HeadWatch, ReadWatch, IdleWriter). 0: 15m.
	TunnelIdleTimeout time.Duration
	// DrainTimeout is the caller's drain budget (0: 10s), as Server.DrainTimeout reports
	// it: Shutdown itself drains until its context ends.
	DrainTimeout   time.Duration
	MaxConnections int // 0: unbounded
	// DNSMaxInflight bounds DNS queries being answered at once (0: 256); a query beyond
	// it gets SERVFAIL at once. DNSMaxTCPConns bounds DNS-over-TCP connections (0: 128);
	// further ones wait in the accept queue.
	DNSMaxInflight int
	DNSMaxTCPConns int

	Logger *slog.Logger
	// Resolver overrides the resolver used for connection decisions (tests); nil means
	// the DNS upstreams.
	Resolver Resolver
	// OwnAddrs are further addresses of this proxy for the internal-address guard; the
	// addresses of the host's interfaces are always included.
	OwnAddrs []netip.Addr
	// DenyPrivate makes the internal-address guard refuse the private-use ranges too
	// (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7), lifted as loopback is.
	DenyPrivate bool

	// wrapRelay lets tests wrap the goproxy handler (to inject failures).
	wrapRelay func(http.Handler) http.Handler
	// clientWatchDelay overrides httpfront.ClientWatchDelay (tests).
	clientWatchDelay time.Duration
	// controlReadTimeout and controlIdleTimeout override the constants of the same
	// names (tests).
	controlReadTimeout, controlIdleTimeout time.Duration
	// dialControl, when set, runs before every upstream connect (tests: refuse anything
	// but loopback, so that a broken guard fails a test without reaching a real address).
	dialControl func(network, address string, c syscall.RawConn) error
	// dial, when set, opens upstream connections instead of net.Dialer (tests: inside a
	// namespace); origDst replaces origdst.Lookup, transparentSniffWait the transparent
	// listener's default wait, and now the clock of the names the DNS server answered.
	dial                 func(ctx context.Context, network, address string) (net.Conn, error)
	origDst              func(*net.TCPConn) (netip.AddrPort, error)
	transparentSniffWait time.Duration
	now                  func() time.Time
}

// Connection types, as they appear in logs and metric labels.
const (
	typeHTTP    = httpfront.TypeHTTP
	typeConnect = httpfront.TypeConnect
	typeDNS     = "dns"
	typeTLS     = "tls" // the server name of a tunnel's ClientHello (see helloGate)
	// typeTransparent is a connection the transparent listener took (see transparent.go).
	typeTransparent = "transparent"
)

// Server is one running sidecar.
type Server struct {
	cfg       Config
	log       *slog.Logger
	metrics   *metrics
	upstreams *dnsupstream.Upstreams
	decider   *Decider
	// ownResolver is the resolver New made (no Config.Resolver): Shutdown closes it.
	ownResolver *dnsupstream.UpstreamResolver
	tracker     *tracker
	held        sync.Map // upstream net.Conn → the *requestClient whose request sends on it (see hold)

	current atomic.Pointer[RuleSet]
	applyMu sync.Mutex // serialises swaps

	goproxy    *goproxy.ProxyHttpServer
	relay      http.Handler // goproxy, as serveProxy calls it
	proxyLn    *connio.LimitListener
	front      *httpfront.Front
	dnsServers []*dns.Server
	adminSrv   *http.Server
	adminLn    net.Listener
	metricsSrv *http.Server
	metricsLn  net.Listener
	dnsAddr    net.Addr
	dns        *dnsserver.Server
	// transparent is the transparent listener (nil: off); fqdn the names the DNS server
	// answered each client, which decide its transparent connections that name nothing.
	transparent *transparent.Listener
	fqdn        *fqdncache.Cache

	tunnelMu sync.Mutex // orders tunnels.Add against the drain's Wait
	tunnels  sync.WaitGroup
	serving  sync.WaitGroup
	started  atomic.Bool // listeners bound, serving (a policy is loaded since New)
	draining atomic.Bool

	// fwd caches the last forwarding check of Ready for forwardingCheckEvery: a probe
	// every few seconds costs two small /proc reads, a flood of probes no more.
	fwdMu sync.Mutex
	fwd   struct {
		at  time.Time
		why string // "" when off
	}
}

// forwardingCheckEvery bounds how stale Ready's view of the forwarding sysctls may be.
const forwardingCheckEvery = time.Second

// New validates cfg and loads the initial policy (the file, or no-network).
func New(cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.controlReadTimeout == 0 {
		cfg.controlReadTimeout = controlReadTimeout
	}
	if cfg.controlIdleTimeout == 0 {
		cfg.controlIdleTimeout = controlIdleTimeout
	}
	defaults := []struct {
		name string
		d    *time.Duration
		def  time.Duration
	}{
		{"HeaderTimeout", &cfg.HeaderTimeout, 10 * time.Second}, {"DialTimeout", &cfg.DialTimeout, 10 * time.Second},
		{"DNSTimeout", &cfg.DNSTimeout, 2 * time.Second}, {"IdleTimeout", &cfg.IdleTimeout, 90 * time.Second},
		{"DrainTimeout", &cfg.DrainTimeout, 10 * time.Second}, {"TunnelIdleTimeout", &cfg.TunnelIdleTimeout, 15 * time.Minute},
	}
	for _, x := range defaults {
		if *x.d < 0 {
			return nil, fmt.Errorf("proxy: Config.%s = %s: must not be negative (0 means %s)", x.name, *x.d, x.def)
		}
		if *x.d == 0 {
			*x.d = x.def
		}
	}
	for _, l := range []struct{ name, value string }{{"Task", cfg.Task}, {"Phase", cfg.Phase}} {
		if !adminapi.ValidLabel(l.value) {
			return nil, fmt.Errorf("proxy: Config.%s = %s: %s", l.name, policy.Quote(l.value), adminapi.LabelRule)
		}
	}
	counts := []struct {
		name string
		n    *int
		def  int
	}{{"MaxConnections", &cfg.MaxConnections, 0}, {"DNSMaxInflight", &cfg.DNSMaxInflight, 256}, {"DNSMaxTCPConns", &cfg.DNSMaxTCPConns, 128}}
	for _, c := range counts {
		if *c.n < 0 {
			return nil, fmt.Errorf("proxy: Config.%s = %d: must not be negative", c.name, *c.n)
		}
		if *c.n == 0 {
			*c.n = c.def
		}
	}
	s := &Server{cfg: cfg, log: cfg.Logger, metrics: newMetrics(), tracker: newTracker(), fqdn: newFQDNCache(cfg.now)}
	s.upstreams = dnsupstream.NewUpstreams(cfg.DNSUpstreams, cfg.DNSTimeout)
	s.dns = s.newDNSServer()
	resolver := cfg.Resolver
	if resolver == nil {
		s.ownResolver = dnsupstream.NewUpstreamResolver(s.upstreams)
		s.ownResolver.Admit = s.dns.Resolvable
		s.ownResolver.Panicked = func(p any) { s.recovered(componentResolver, "", "", p) }
		resolver = s.ownResolver
	}
	s.decider = &Decider{Resolver: resolver}
	s.metrics.connectionsCap.Set(float64(cfg.MaxConnections))

	initial := policy.NoNetwork
	if cfg.PolicyFile != "" {
		p, err := readPolicyFile(cfg.PolicyFile)
		if err != nil {
			return nil, err
		}
		initial = p
	}
	task, phase := cfg.Task, cfg.Phase
	s.Apply(initial, &task, &phase, "start")
	s.goproxy = s.newGoproxy()
	s.relay = s.goproxy
	if cfg.wrapRelay != nil {
		s.relay = cfg.wrapRelay(s.goproxy)
	}
	return s, nil
}

func readPolicyFile(path string) (policy.Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return policy.Policy{}, fmt.Errorf("proxy: read policy: %w", err)
	}
	p, err := policy.Parse(data)
	if err != nil {
		return policy.Policy{}, fmt.Errorf("proxy: policy file %s: %w", path, err)
	}
	return p, nil
}

// Current is the rule set in force.
func (s *Server) Current() *RuleSet { return s.current.Load() }

// ProxyAddr, DNSAddr and MetricsAddr are the bound addresses (after Start).
func (s *Server) ProxyAddr() net.Addr { return s.proxyLn.Addr() }
func (s *Server) DNSAddr() net.Addr   { return s.dnsAddr }
func (s *Server) MetricsAddr() net.Addr {
	if s.metricsLn == nil {
		return nil
	}
	return s.metricsLn.Addr()
}

// TransparentAddr is the transparent listener's bound address (nil: off).
func (s *Server) TransparentAddr() net.Addr {
	if s.transparent == nil {
		return nil
	}
	return s.transparent.Addr()
}

// Start binds every listener and serves in the background. A bind failure is returned
// and nothing keeps running.
func (s *Server) Start() (err error) {
	if s.cfg.AdminSocket == "" {
		return errors.New("proxy: Config.AdminSocket is empty: the admin API needs a unix socket path")
	}
	var closers []func()
	defer func() {
		if err != nil {
			for _, c := range closers {
				c()
			}
		}
	}()
	ln, err := connio.ListenProxy(s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("proxy: listen %s: %w", s.cfg.Listen, err)
	}
	closers = append(closers, func() { ln.Close() })
	s.proxyLn = connio.NewLimitListener(ln, s.cfg.MaxConnections)

	var dnsConns []any
	if s.cfg.DNSListen != "" {
		pc, tl, err := listenDNS(s.cfg.DNSListen)
		if err != nil {
			return err
		}
		closers = append(closers, func() { pc.Close(); tl.Close() })
		s.dnsAddr = pc.LocalAddr()
		dnsConns = append(dnsConns, pc, tl)
	}

	if err := os.MkdirAll(filepath.Dir(s.cfg.AdminSocket), 0o750); err != nil {
		return fmt.Errorf("proxy: admin socket dir: %w", err)
	}
	if err := removeStaleSocket(s.cfg.AdminSocket); err != nil {
		return err
	}
	adminLn, err := connio.ListenAdmin(s.cfg.AdminSocket)
	if err != nil {
		return fmt.Errorf("proxy: admin listen %s: %w", s.cfg.AdminSocket, err)
	}
	closers = append(closers, func() { adminLn.Close() })
	s.adminLn = adminLn

	if s.cfg.TransparentListen != "" {
		if err := s.listenTransparent(); err != nil {
			return fmt.Errorf("proxy: transparent listen %s: %w", s.cfg.TransparentListen, err)
		}
		closers = append(closers, func() { s.transparent.Close() })
	}

	if s.cfg.MetricsListen != "" {
		ml, err := connio.ListenTCP(s.cfg.MetricsListen, net.ListenConfig{})
		if err != nil {
			return fmt.Errorf("proxy: metrics listen %s: %w", s.cfg.MetricsListen, err)
		}
		closers = append(closers, func() { ml.Close() })
		s.metricsLn = ml
	}

	s.decider.Guard = addrguard.New(addrguard.Config{
		Exempt: s.cfg.AllowInternal, DenyPrivate: s.cfg.DenyPrivate,
		OwnAddrs: s.ownAddrs, Listeners: s.listenEndpoints(),
	})
	s.serve(dnsConns)
	s.started.Store(true)
	// Said at once, not only to whoever asks /readyz. (The transparent listener's own
	// goroutine may not be accepting yet: that is no reason to log.)
	if s.cfg.RequireNoForwarding {
		if why := s.forwarding(); why != "" {
			s.log.Error("not ready: this sidecar would route packets", "why", why)
		}
	}
	return nil
}

// removeStaleSocket removes the socket a previous run left at path, and nothing else: a
// mistyped --admin-socket must not delete a file.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("proxy: admin socket %s: %w", path, err)
	}
	if t := fi.Mode().Type(); t != os.ModeSocket {
		what := "a file of mode " + t.String()
		switch {
		case t.IsRegular():
			what = "a regular file"
		case t.IsDir():
			what = "a directory"
		}
		return fmt.Errorf("proxy: admin socket (--admin-socket) %s is %s, not a socket; refusing to remove it", path, what)
	}
	// Stale means nobody listens: a socket a running sidecar serves is not replaced (its
	// controller would reach the new one instead, and its exit would unlink ours).
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("proxy: admin socket (--admin-socket) %s is in use by a running process; refusing to replace it", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("proxy: admin socket (--admin-socket) %s: cannot tell whether it is stale: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("proxy: remove stale admin socket %s: %w", path, err)
	}
	return nil
}

// listenDNS binds UDP and TCP on one port. With port 0 the TCP port may be taken by
// another socket, so it tries a few UDP ports.
func listenDNS(addr string) (net.PacketConn, net.Listener, error) {
	var lastErr error
	for range 10 {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("proxy: dns listen udp %s: %w", addr, err)
		}
		tl, err := connio.ListenTCP(pc.LocalAddr().String(), net.ListenConfig{})
		if err == nil {
			return pc, tl, nil
		}
		pc.Close()
		lastErr = fmt.Errorf("proxy: dns listen tcp %s: %w", pc.LocalAddr(), err)
		if _, port, _ := net.SplitHostPort(addr); port != "0" {
			break
		}
	}
	return nil, nil, lastErr
}

// ownAddrs are the host's interface addresses (read again as networks come and go), the
// bound proxy and DNS addresses and any configured extras: a sandbox must not loop back
// into the sidecar. The gateways of its routes come with them: through them a sandbox
// would reach the Docker host itself.
func (s *Server) ownAddrs() []netip.Addr {
	own := append([]netip.Addr(nil), s.cfg.OwnAddrs...)
	own = append(own, procnet.RouteGateways(s.cfg.ProcRoot)...)
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				own = append(own, p.Addr())
			}
		}
	}
	for _, a := range []net.Addr{s.proxyLn.Addr(), s.dnsAddr} {
		if a == nil {
			continue
		}
		if ap, err := netip.ParseAddrPort(a.String()); err == nil && !ap.Addr().IsUnspecified() {
			own = append(own, ap.Addr())
		}
	}
	return own
}

// listenEndpoints are the bound TCP endpoints a tunnel could loop back into.
func (s *Server) listenEndpoints() []netip.AddrPort {
	var eps []netip.AddrPort
	for _, a := range []net.Addr{s.proxyLn.Addr(), s.dnsAddr, s.MetricsAddr(), s.TransparentAddr()} {
		if a == nil {
			continue
		}
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			eps = append(eps, ap)
		}
	}
	return eps
}

func (s *Server) serve(dnsConns []any) {
	s.front = s.newFront()
	s.goServe(s.front.Serve)
	if s.transparent != nil {
		s.goServe(s.transparent.Serve)
	}

	for _, c := range dnsConns {
		srv := s.dns.DNSServer()
		switch x := c.(type) {
		case net.PacketConn:
			srv.PacketConn, srv.Net = x, "udp"
		case net.Listener:
			srv.Listener, srv.Net = connio.NewCapListener(x, s.cfg.DNSMaxTCPConns), "tcp"
		}
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		s.dnsServers = append(s.dnsServers, srv)
		s.goServe(srv.ActivateAndServe)
		// miekg/dns ignores a shutdown that comes before it started serving.
		<-started
	}

	s.adminSrv = s.controlServer(s.adminHandler())
	s.goServe(func() error { return s.adminSrv.Serve(s.adminLn) })
	if s.metricsLn != nil {
		s.metricsSrv = s.controlServer(s.metricsHandler())
		s.goServe(func() error { return s.metricsSrv.Serve(s.metricsLn) })
	}
}

// Bounds of the admin and metrics servers, whose clients are the controller, a
// scraper and the healthcheck on the same host: a request, a PUT's body of up to
// adminapi.MaxPolicyBody included, takes milliseconds there, so a client that takes seconds has
// stalled, and holds a goroutine (and the body read so far) until these end it.
const (
	controlHeaderTimeout = 10 * time.Second
	controlReadTimeout   = 30 * time.Second
	controlIdleTimeout   = time.Minute
)

// controlServer serves h on the admin socket or the metrics listener.
func (s *Server) controlServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: controlHeaderTimeout,
		ReadTimeout: s.cfg.controlReadTimeout, IdleTimeout: s.cfg.controlIdleTimeout}
}

func (s *Server) goServe(serve func() error) {
	s.serving.Add(1)
	go func() {
		defer s.serving.Done()
		if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			s.log.Error("listener stopped", "error", err.Error())
		}
	}()
}

// Ready reports readiness and, if not ready, why: listeners bound (Start returned), a
// policy loaded (always: no-network at least), not draining and, when required,
// forwarding off. Forwarding is read again (at most once per forwardingCheckEvery), since
// a sysctl can change under a running sidecar; a change is logged.
func (s *Server) Ready() (bool, string) {
	if s.draining.Load() {
		return false, "draining"
	}
	if !s.started.Load() {
		return false, "starting"
	}
	if s.transparent != nil && !s.transparent.Serving() {
		return false, "transparent listener not serving"
	}
	if !s.cfg.RequireNoForwarding {
		return true, ""
	}
	if why := s.forwarding(); why != "" {
		return false, why
	}
	return true, ""
}

// forwarding is procnet.ForwardingOn, cached; it logs when the answer changes.
func (s *Server) forwarding() string {
	s.fwdMu.Lock()
	defer s.fwdMu.Unlock()
	now := time.Now()
	if !s.fwd.at.IsZero() && now.Sub(s.fwd.at) < forwardingCheckEvery {
		return s.fwd.why
	}
	why := procnet.ForwardingOn(s.cfg.ProcRoot)
	if !s.fwd.at.IsZero() && why != s.fwd.why {
		if why != "" {
			s.log.Error("not ready: this sidecar would route packets", "why", why)
		} else {
			s.log.Info("ready: forwarding is off", "was", s.fwd.why)
		}
	}
	s.fwd.at, s.fwd.why = now, why
	return why
}

// DrainTimeout is the drain budget after defaults (Config.DrainTimeout, 0: 10s).
func (s *Server) DrainTimeout() time.Duration { return s.cfg.DrainTimeout }

// Shutdown drains: stop accepting, let requests and tunnels finish until ctx ends, then
// cut whatever is left and stop the admin and metrics servers (closing the admin
// listener removes its socket file).
func (s *Server) Shutdown(ctx context.Context) error {
	s.tunnelMu.Lock()
	s.draining.Store(true)
	s.tunnelMu.Unlock()
	s.proxyLn.Close()
	if s.transparent != nil {
		s.transparent.Close()
	}
	for _, d := range s.dnsServers {
		_ = d.ShutdownContext(ctx)
		if d.PacketConn != nil {
			_ = d.PacketConn.Close()
		}
		if d.Listener != nil {
			_ = d.Listener.Close()
		}
	}
	s.front.Shutdown(ctx)
	if s.ownResolver != nil {
		s.ownResolver.Close()
	}
	done := make(chan struct{})
	go func() { s.tunnels.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.tracker.closeIf(func(*liveConn) bool { return true })
		<-done
	}
	s.current.Load().closeIdle()
	_ = s.adminSrv.Close()
	if s.metricsSrv != nil {
		_ = s.metricsSrv.Close()
	}
	s.serving.Wait()
	if s.transparent != nil {
		s.transparent.Wait()
	}
	return nil
}
