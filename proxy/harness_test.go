package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"go.uber.org/goleak"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/internal/testutil"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/proxy/internal/tcptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hangGuard bounds a test's wait for something the proxy must do (close a connection,
// answer, log a line). It is far above any time a slow or loaded machine plausibly
// takes, so that reaching it means the event never came (a hang), not that it came
// late: how long things take belongs in benchmarks, not in assertions.
const hangGuard = 30 * time.Second

// fakeDNS is an in-process upstream resolver serving .test names.
type fakeDNS struct {
	mu      sync.Mutex
	records map[string][]netip.Addr
	// truncate names are answered with TC set (and no records) over UDP.
	truncate map[string]bool
	ids      []uint16
	msgs     []*dns.Msg // every query as it arrived
	addr     string
	servers  []*dns.Server
}

func startFakeDNS(t testing.TB, records map[string][]netip.Addr) *fakeDNS {
	t.Helper()
	f := &fakeDNS{records: map[string][]netip.Addr{}, truncate: map[string]bool{}}
	for k, v := range records {
		f.records[dns.Fqdn(k)] = v
	}
	pc, ln, err := listenDNS("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = pc.LocalAddr().String()
	var wg sync.WaitGroup
	for _, srv := range []*dns.Server{{PacketConn: pc, Net: "udp"}, {Listener: ln, Net: "tcp"}} {
		srv.Handler = dns.HandlerFunc(f.serve)
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		f.servers = append(f.servers, srv)
		wg.Add(1)
		go func() { defer wg.Done(); _ = srv.ActivateAndServe() }()
		<-started
	}
	t.Cleanup(func() {
		for _, s := range f.servers {
			_ = s.Shutdown()
		}
		wg.Wait()
	})
	return f
}

func (f *fakeDNS) set(name string, addrs ...netip.Addr) {
	f.mu.Lock()
	f.records[dns.Fqdn(name)] = addrs
	f.mu.Unlock()
}

func (f *fakeDNS) seenIDs() []uint16 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]uint16(nil), f.ids...)
}

func (f *fakeDNS) seenMsgs() []*dns.Msg {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*dns.Msg(nil), f.msgs...)
}

func (f *fakeDNS) serve(w dns.ResponseWriter, req *dns.Msg) {
	q := req.Question[0]
	f.mu.Lock()
	f.ids = append(f.ids, req.Id)
	f.msgs = append(f.msgs, req.Copy())
	addrs, ok := f.records[strings.ToLower(q.Name)]
	trunc := f.truncate[strings.ToLower(q.Name)]
	f.mu.Unlock()
	m := new(dns.Msg)
	m.SetReply(req)
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp && trunc {
		m.Truncated = true
		_ = w.WriteMsg(m)
		return
	}
	if !ok {
		m.Rcode = dns.RcodeNameError
	}
	for _, a := range addrs {
		hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: 60}
		switch {
		case a.Is4() && q.Qtype == dns.TypeA:
			hdr.Rrtype = dns.TypeA
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
		case a.Is6() && q.Qtype == dns.TypeAAAA:
			hdr.Rrtype = dns.TypeAAAA
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
		}
	}
	_ = w.WriteMsg(m)
}

// upstream is an in-process destination on one loopback address: an HTTP server that
// reports what it saw, and a TCP echo server for tunnels.
type upstream struct {
	ip       netip.Addr
	httpPort uint16
	echoPort uint16
	srv      *http.Server
	echo     net.Listener
	wg       sync.WaitGroup
}

func startUpstream(t testing.TB, ip string) *upstream {
	t.Helper()
	u := &upstream{ip: netip.MustParseAddr(ip)}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	u.httpPort = uint16(ln.Addr().(*net.TCPAddr).Port)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "host=%s local=%s body=%d", r.Host, ip, len(body))
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		for {
			if _, err := io.WriteString(w, "tick\n"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "want upgrade", http.StatusBadRequest)
			return
		}
		c, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_, _ = io.Copy(c, rw.Reader)
	})
	u.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	u.wg.Add(1)
	go func() { defer u.wg.Done(); _ = u.srv.Serve(ln) }()

	u.echo, err = net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	u.echoPort = uint16(u.echo.Addr().(*net.TCPAddr).Port)
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		var conns sync.WaitGroup
		defer conns.Wait()
		for {
			c, err := u.echo.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer c.Close()
				// Echo until the client half-closes, then say how much arrived and
				// half-close back: a tunnel must carry both EOFs.
				n, _ := io.Copy(c, c)
				fmt.Fprintf(c, "|eof after %d", n)
				_ = c.(*net.TCPConn).CloseWrite()
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = u.srv.Close()
		_ = u.echo.Close()
		u.wg.Wait()
	})
	return u
}

func (u *upstream) httpHostPort(name string) string {
	return net.JoinHostPort(name, fmt.Sprint(u.httpPort))
}
func (u *upstream) echoHostPort(name string) string {
	return net.JoinHostPort(name, fmt.Sprint(u.echoPort))
}

type harness struct {
	t      testing.TB
	srv    *Server
	dns    *fakeDNS
	a, b   *upstream // a.test → 127.0.0.2, b.test → 127.0.0.3
	c      *upstream // x.svc.test, svc.test → 127.0.0.4
	socket string
	logs   *testutil.SyncBuffer
	client *http.Client
}

func newHarness(t testing.TB, tune ...func(*Config)) *harness {
	t.Helper()
	h := &harness{t: t, logs: &testutil.SyncBuffer{}}
	h.a = startUpstream(t, "127.0.0.2")
	h.b = startUpstream(t, "127.0.0.3")
	h.c = startUpstream(t, "127.0.0.4")
	h.dns = startFakeDNS(t, map[string][]netip.Addr{
		"a.test":     {netip.MustParseAddr("127.0.0.2")},
		"b.test":     {netip.MustParseAddr("127.0.0.3")},
		"svc.test":   {netip.MustParseAddr("127.0.0.4")},
		"x.svc.test": {netip.MustParseAddr("127.0.0.4")},
		"dual.test":  {netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")},
	})
	h.socket = filepath.Join(t.TempDir(), "run", "admin.sock")
	cfg := Config{
		Listen:        "127.0.0.1:0",
		DNSListen:     "127.0.0.1:0",
		MetricsListen: "127.0.0.1:0",
		AdminSocket:   h.socket,
		DNSUpstreams:  []string{h.dns.addr},
		AllowInternal: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		DNSTimeout:    time.Second,
		DialTimeout:   10 * time.Second,
		DrainTimeout:  2 * time.Second,
		Logger:        slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		dialControl:   loopbackOnly,
		// No routes, so that the test machine's own gateways do not change what a
		// test sees.
		ProcRoot: t.TempDir(),
	}
	for _, f := range tune {
		f(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	h.srv = srv
	proxyURL := &url.URL{Scheme: "http", Host: srv.ProxyAddr().String()}
	h.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}}
	t.Cleanup(func() {
		h.client.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return h
}

// apply puts a wire-format policy in force directly (the admin API has its own tests).
func (h *harness) apply(doc string) adminapi.ApplyResult {
	h.t.Helper()
	p, err := policy.Parse([]byte(doc))
	if err != nil {
		h.t.Fatalf("policy %s: %v", doc, err)
	}
	return h.srv.Apply(p, nil, nil, "test")
}

// get fetches url through the proxy: status, X-Compass-Egress header and body.
func (h *harness) get(rawURL string) (int, string, string) {
	h.t.Helper()
	resp, err := h.client.Get(rawURL)
	if err != nil {
		h.t.Fatalf("GET %s: %v", rawURL, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Compass-Egress"), string(body)
}

// tunnelConn is a client connection after a CONNECT.
type tunnelConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *tunnelConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// connect opens a CONNECT tunnel; early is sent in the same write as the request.
// It returns the response and, on 200, the tunnel.
// websocket upgrades a connection to host's /ws echo through the proxy, checks that one
// frame comes back, and returns the reader of the relayed connection (closed with the
// test).
func (h *harness) websocket(t testing.TB, host string, deadline time.Duration) *bufio.Reader {
	t.Helper()
	c, err := net.Dial("tcp", h.srv.ProxyAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(deadline))
	fmt.Fprintf(c, "GET http://%s:%d/ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host, h.a.httpPort, host)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	_, _ = io.WriteString(c, "frame")
	buf := make([]byte, 5)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "frame" {
		t.Fatalf("echo %q %v", buf, err)
	}
	return br
}

func (h *harness) connect(target string, early string) (*http.Response, *tunnelConn) {
	h.t.Helper()
	c, err := net.Dial("tcp", h.srv.ProxyAddr().String())
	if err != nil {
		h.t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n%s", target, target, early); err != nil {
		h.t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		c.Close()
		h.t.Fatalf("CONNECT %s: %v", target, err)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(bytes.NewReader(body))
		c.Close()
		return resp, nil
	}
	h.t.Cleanup(func() { c.Close() })
	return resp, &tunnelConn{Conn: c, r: br}
}

// connectStatus is the status of a CONNECT (closing the tunnel right away).
func (h *harness) connectStatus(target string) (int, string) {
	h.t.Helper()
	resp, tc := h.connect(target, "")
	if tc != nil {
		tc.Close()
	}
	return resp.StatusCode, resp.Header.Get("X-Compass-Egress")
}

// raw sends bytes to the proxy and returns everything it answers until it closes.
func (h *harness) raw(req string) string {
	h.t.Helper()
	c, err := net.Dial("tcp", h.srv.ProxyAddr().String())
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	if _, err := io.WriteString(c, req); err != nil {
		h.t.Fatal(err)
	}
	out, _ := io.ReadAll(c)
	return string(out)
}

// admin calls the admin API over its unix socket.
func (h *harness) admin(method, path, body string) (int, map[string]any) {
	h.t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", h.socket)
		},
	}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequest(method, "http://admin"+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(data) > 0 && data[0] == '{' {
		if err := json.Unmarshal(data, &out); err != nil {
			h.t.Fatalf("%s %s: %v: %s", method, path, err, data)
		}
	}
	return resp.StatusCode, out
}

// query asks the proxy's DNS server.
func (h *harness) query(name string, qtype uint16, network string) *dns.Msg {
	h.t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.SetEdns0(1232, false)
	c := &dns.Client{Net: network, Timeout: hangGuard}
	resp, _, err := c.Exchange(m, h.srv.DNSAddr().String())
	if err != nil {
		h.t.Fatalf("dns %s: %v", name, err)
	}
	return resp
}

// queryLater asks the proxy's DNS server for name's A records on a goroutine of its
// own (10 s timeout), for tests that change things while the query is in flight; the
// channel gets the answer, nil on an error (reported with t.Error).
func (h *harness) queryLater(t *testing.T, name string) <-chan *dns.Msg {
	answer := make(chan *dns.Msg, 1)
	go func() {
		q := new(dns.Msg)
		q.SetQuestion(dns.Fqdn(name), dns.TypeA)
		r, _, err := (&dns.Client{Timeout: 10 * time.Second}).Exchange(q, h.srv.DNSAddr().String())
		if err != nil {
			t.Error(err)
		}
		answer <- r
	}()
	return answer
}

func ede(m *dns.Msg) (uint16, bool) {
	opt := m.IsEdns0()
	if opt == nil {
		return 0, false
	}
	for _, o := range opt.Option {
		if e, ok := o.(*dns.EDNS0_EDE); ok {
			return e.InfoCode, true
		}
	}
	return 0, false
}

// dialProxy connects to the proxy; the connection closes when the test ends and has a
// 20 s deadline.
func (h *harness) dialProxy(t testing.TB) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", h.srv.ProxyAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	return c
}

// waitLive waits until a connection is live (tracked): a CONNECT or request decided
// and dialling, whose decision line may not be written yet (a CONNECT's comes after
// its dial, to name the address dialled).
func (h *harness) waitLive(t *testing.T) {
	t.Helper()
	waitFor(t, func() bool {
		h.srv.tracker.mu.Lock()
		defer h.srv.tracker.mu.Unlock()
		return len(h.srv.tracker.conns) > 0
	})
}

// Loopback socket helpers, shared with connio's tests.
var (
	tcpPair    = testutil.TCPPair
	tcpSockopt = testutil.TCPSockopt
	sockoptInt = testutil.SockoptInt
)

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, hangGuard, cond)
}

func discardLogger() *slog.Logger { return slog.New(slog.NewJSONHandler(io.Discard, nil)) }

// serveTCP and readHead: see tcptest.Serve and tcptest.ReadHead.
var (
	serveTCP = tcptest.Serve
	readHead = tcptest.ReadHead
)

// serveRawHTTP serves ip with an upstream that reads the requests of each connection
// one after another and has answer write each one's answer as it is to go out (where
// net/http's server would rewrite it); the connection ends when answer returns false.
func serveRawHTTP(t testing.TB, ip string, answer func(c net.Conn, req *http.Request) bool) *net.TCPAddr {
	t.Helper()
	return serveTCP(t, ip, func(c net.Conn, _ <-chan struct{}) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil || !answer(c, req) {
				return
			}
		}
	})
}

func (t *tracker) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.conns)
}

// loopbackOnly refuses, before the connect, every upstream dial outside loopback: a
// test whose guard or policy broke fails with a 502 and never reaches a real address
// (the cloud metadata service of the machine running it, say).
func loopbackOnly(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil || !ap.Addr().Unmap().IsLoopback() {
		return fmt.Errorf("test: refusing to dial %s: not a loopback address", address)
	}
	return nil
}

// TestHarnessDialsOnlyLoopback: what a test's proxy would dial outside loopback (here
// a documentation address the public policy allows) is refused before the connect, so
// a broken guard shows as a failed test, never as a connection to a real address.
func TestHarnessDialsOnlyLoopback(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	for _, target := range []string{"192.0.2.1:80", "[2001:db8::1]:80"} {
		if status, header := h.connectStatus(target); status != http.StatusBadGateway || header != "error; reason=dial-failed" {
			t.Errorf("CONNECT %s: %d %q, want 502 dial-failed", target, status, header)
		}
	}
	if !strings.Contains(h.logs.String(), "refusing to dial 192.0.2.1:80: not a loopback address") {
		t.Errorf("the dial was not refused by the harness:\n%s", h.logs.String())
	}
}
