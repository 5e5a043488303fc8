package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/proxy/tlshello"
	"github.com/compass-egress/compass-egress/proxy/tlshello/hellotest"
	"github.com/compass-egress/compass-egress/proxy/upclient"
)

var (
	addrA = netip.MustParseAddr("127.0.0.2") // a.test
	addrB = netip.MustParseAddr("127.0.0.3") // b.test
)

const allowA = `{"network_mode":"allowlist","allowed_hosts":["a.test"]}`

// A TLS connection is decided on its ClientHello's server name at the original port,
// and goes to the original address only when that address is the name's.
func TestTransparentTLS(t *testing.T) {
	host := hellotest.Host
	for _, tc := range []struct {
		name    string
		policy  string
		hello   func(t *testing.T) []byte
		toB     bool  // the original destination is b.test's echo port, not a.test's
		writes  []int // the hello's first bytes in writes of these sizes
		refused string
		host    string // the decision line's host
	}{
		{name: "allowed name", policy: allowA, hello: helloFor("a.test"), host: "a.test"},
		{name: "refused name", policy: allowA, hello: helloFor("b.test"), toB: true, refused: "not-allowlisted", host: "b.test"},
		{name: "allowed name to a foreign address", policy: allowA, hello: helloFor("a.test"), toB: true, refused: ReasonSNIAddressMismatch, host: "a.test"},
		{name: "a foreign address an address rule allows", policy: `{"network_mode":"allowlist","allowed_hosts":["a.test","127.0.0.3/32"]}`,
			hello: helloFor("a.test"), toB: true, host: "127.0.0.3"},
		{name: "a denied name to an address the denylist leaves", policy: `{"network_mode":"denylist","denied_hosts":["b.test"]}`,
			hello: helloFor("b.test"), refused: "denylisted", host: "b.test"},
		{name: "allowed name at another port", policy: `{"network_mode":"allowlist","allowed_hosts":["a.test:1"]}`, hello: helloFor("a.test"), refused: "not-allowlisted", host: "a.test"},
		{name: "hello split across segments and records", policy: allowA, hello: func(t *testing.T) []byte {
			return hellotest.Refragment(hellotest.ClientHello(t, "a.test"), 7)
		}, writes: []int{1, 3, 20}, host: "a.test"},
		{name: "encrypted hello", policy: allowA, hello: func(*testing.T) []byte {
			return hellotest.With(append(hellotest.SNIExt(host, "a.test"), 0xfe, 0x0d, 0, 4, 1, 2, 3, 4))
		}, refused: ReasonEncryptedHello, host: "a.test"},
		{name: "an address for a name", policy: `{"network_mode":"allowlist","allowed_hosts":["127.0.0.2/32"]}`, hello: func(*testing.T) []byte {
			return hellotest.With(hellotest.SNIExt(host, "127.0.0.2"))
		}, refused: ReasonInvalidHost, host: "127.0.0.2"},
		{name: "two names", policy: allowA, hello: func(*testing.T) []byte {
			return hellotest.With(hellotest.SNIExt(host, "a.test", host, "b.test"))
		}, refused: ReasonMalformedHello, host: "127.0.0.2"},
		{name: "no name is decided on the address", policy: allowA, hello: helloFor(""), refused: "not-allowlisted", host: "127.0.0.2"},
		{name: "no name, an address rule", policy: `{"network_mode":"allowlist","allowed_hosts":["127.0.0.2/32"]}`, hello: helloFor(""), host: "127.0.0.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			th := newTransparentHarness(t)
			th.apply(tc.policy)
			dst := ap(addrA, th.a.echoPort)
			if tc.toB {
				dst = ap(addrB, th.b.echoPort)
			}
			hello := tc.hello(t)
			c := th.dial(t, "127.0.0.1", dst)
			rest := hello
			for _, n := range tc.writes {
				if _, err := c.Write(rest[:n]); err != nil {
					t.Fatal(err)
				}
				rest = rest[n:]
				time.Sleep(20 * time.Millisecond) // separate segments
			}
			if tc.refused == "" {
				if _, err := c.Write(rest); err != nil {
					t.Fatal(err)
				}
				_ = c.CloseWrite()
				if got, want := readAll(c), fmt.Sprintf("%s|eof after %d", hello, len(hello)); got != want {
					t.Fatalf("not relayed: read %d bytes, want the hello's %d and the end", len(got), len(hello))
				}
			} else {
				_, _ = c.Write(rest)
				if got := readAll(c); got != string(tlshello.UnrecognizedNameAlert) {
					t.Fatalf("refusal: got %x, want the unrecognized_name alert", got)
				}
			}
			l := th.line(t, 1)
			wantDecision, wantReason := "allowed", "allowlisted"
			if tc.refused != "" {
				wantDecision, wantReason = "denied", tc.refused
			}
			if l["decision"] != wantDecision || l["reason"] != wantReason || l["protocol"] != "tls" || l["host"] != tc.host ||
				l["original_dst"] != dst.String() || l["port"] != float64(dst.Port()) || l["addr"] != dst.Addr().String() {
				t.Fatalf("decision line %v", l)
			}
		})
	}
}

func helloFor(name string) func(t *testing.T) []byte {
	return func(t *testing.T) []byte { return hellotest.ClientHello(t, name) }
}

// An HTTP/1 connection is served as forward-proxy requests: each request is decided
// on its own Host, and goes to the original address only.
func TestTransparentHTTP(t *testing.T) {
	th := newTransparentHarness(t)
	th.apply(allowA)
	aPort := fmt.Sprint(th.a.httpPort)
	for _, tc := range []struct {
		name    string
		dst     netip.AddrPort
		hosts   []string // one request each, on one connection
		want    []string // "200" or the refusal's reason, per request
		reached string   // the body's local= of an allowed request
	}{
		{name: "allowed Host", dst: ap(addrA, th.a.httpPort), hosts: []string{"a.test:" + aPort}, want: []string{"200"}},
		{name: "Host without a port takes the original one", dst: ap(addrA, th.a.httpPort), hosts: []string{"a.test"}, want: []string{"200"}},
		{name: "refused Host", dst: ap(addrB, th.b.httpPort), hosts: []string{"b.test"}, want: []string{"not-allowlisted"}},
		{name: "Host of an allowed name to a foreign address", dst: ap(addrB, th.b.httpPort), hosts: []string{"a.test"}, want: []string{ReasonHostAddressMismatch}},
		{name: "Host with another port", dst: ap(addrA, th.a.httpPort), hosts: []string{"a.test:1"}, want: []string{ReasonHostAddressMismatch}},
		{name: "keep-alive: each request decided on its own Host", dst: ap(addrA, th.a.httpPort),
			hosts: []string{"a.test", "b.test", "a.test"}, want: []string{"200", "not-allowlisted"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := th.dial(t, "127.0.0.1", tc.dst)
			br := bufio.NewReader(c)
			for i, want := range tc.want {
				status, header, body := httpOn(t, c, br, tc.hosts[i])
				if want == "200" {
					if status != 200 || !strings.Contains(body, "local="+tc.dst.Addr().String()) {
						t.Fatalf("request %d (Host %s): %d %q", i, tc.hosts[i], status, body)
					}
					continue
				}
				if status != 403 || header != "denied; reason="+want {
					t.Fatalf("request %d (Host %s): %d %q, want 403 %s", i, tc.hosts[i], status, header, want)
				}
			}
		})
	}
	for _, l := range th.transparentLines() {
		if l["protocol"] != "http" || l["original_dst"] == "" {
			t.Fatalf("decision line %v", l)
		}
	}
}

// A connection that names nothing (SSH, a database) is decided on the names the DNS
// server answered its client for its address, else on the address alone.
func TestTransparentTCP(t *testing.T) {
	for _, tc := range []struct {
		name    string
		policy  string // %d: the echo port
		learn   []string
		from    string // the connection's client; the lookups come from 127.0.0.1
		later   time.Duration
		refused string
		host    string
	}{
		{name: "allowed by a learned name", policy: `["git.test:%d"]`, learn: []string{"git.test"}, host: "git.test"},
		{name: "refused without a lookup", policy: `["git.test:%d"]`, refused: "not-allowlisted", host: "127.0.0.2"},
		{name: "a name learned by another client", policy: `["git.test:%d"]`, learn: []string{"git.test"}, from: "127.0.0.9", refused: "not-allowlisted", host: "127.0.0.2"},
		{name: "an expired answer", policy: `["git.test:%d"]`, learn: []string{"git.test"}, later: time.Hour, refused: "not-allowlisted", host: "127.0.0.2"},
		{name: "a shared address: the name not allowed at the port", policy: `["git.test:%d","web.test:1"]`, learn: []string{"web.test"}, refused: "not-allowlisted", host: "web.test"},
		{name: "a shared address: either name learned", policy: `["git.test:%d","web.test:1"]`, learn: []string{"web.test", "git.test"}, host: "git.test"},
		{name: "an address rule", policy: `["127.0.0.2/32","x.test:%d"]`, host: "127.0.0.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			th := newTransparentHarness(t)
			th.dns.set("git.test", addrA)
			th.dns.set("web.test", addrA)
			th.apply(fmt.Sprintf(`{"network_mode":"allowlist","allowed_hosts":`+tc.policy+`}`, th.a.echoPort))
			for _, n := range tc.learn {
				if !th.resolve(t, "127.0.0.1", n) {
					t.Fatalf("%s not answered", n)
				}
			}
			th.advance(tc.later)
			from := "127.0.0.1"
			if tc.from != "" {
				from = tc.from
			}
			dst := ap(addrA, th.a.echoPort)
			c := th.dial(t, from, dst)
			ok, why := echoes(c, []byte("SSH-2.0-test\r\n"))
			if tc.refused == "" && !ok {
				t.Fatalf("not relayed: %s", why)
			}
			if tc.refused != "" && ok {
				t.Fatal("relayed, want refused")
			}
			l := th.line(t, 1)
			if tc.refused != "" && (l["decision"] != "denied" || l["reason"] != tc.refused) || tc.refused == "" && l["decision"] != "allowed" ||
				l["protocol"] != "tcp" || l["host"] != tc.host || l["original_dst"] != dst.String() {
				t.Fatalf("decision line %v", l)
			}
		})
	}
}

// A client that sends nothing is decided once the sniff wait has passed (a server that
// speaks first gets through), and its connection holds its slot no longer than the
// tunnel idle bound; a refused one gives it back at once.
func TestTransparentSilentClient(t *testing.T) {
	banner := serveTCP(t, "127.0.0.5", func(c net.Conn, done <-chan struct{}) {
		_, _ = io.WriteString(c, "220 banner\r\n")
		_, _ = io.Copy(io.Discard, c)
	})
	dst := netip.MustParseAddrPort(banner.String())
	for _, tc := range []struct {
		name, policy string
		allowed      bool
	}{
		{"allowed", `{"network_mode":"allowlist","allowed_hosts":["127.0.0.5/32"]}`, true},
		{"refused", allowA, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			th := newTransparentHarness(t, func(c *Config) { c.TunnelIdleTimeout = testTunnelIdle; c.MaxConnections = 4 })
			th.apply(tc.policy)
			idle := 2 // both accept loops hold a slot while they wait
			waitFor(t, func() bool { return th.srv.proxyLn.Held() == idle })
			start := time.Now()
			c := th.dial(t, "127.0.0.1", dst)
			got := readAll(c) // the banner, then the end: idle, or refused
			if tc.allowed && got != "220 banner\r\n" || !tc.allowed && got != "" {
				t.Fatalf("read %q", got)
			}
			if took := time.Since(start); took < testSniffWait || tc.allowed && took < testTunnelIdle {
				t.Fatalf("ended after %s: before the sniff wait or the idle bound", took)
			}
			waitFor(t, func() bool { return th.srv.proxyLn.Held() == idle })
			if l := th.line(t, 1); l["protocol"] != "tcp" || (l["decision"] == "allowed") != tc.allowed {
				t.Fatalf("decision line %v", l)
			}
		})
	}
}

// A swap re-decides transparent connections as it re-decides tunnels, and cuts the ones
// the new policy refuses.
func TestTransparentSwapCuts(t *testing.T) {
	th := newTransparentHarness(t)
	th.dns.set("git.test", addrA)
	th.apply(fmt.Sprintf(`{"network_mode":"allowlist","allowed_hosts":["git.test:%d","a.test"]}`, th.a.echoPort))
	if !th.resolve(t, "127.0.0.1", "git.test") {
		t.Fatal("git.test not answered")
	}
	dst := ap(addrA, th.a.echoPort)
	tcp := th.dial(t, "127.0.0.1", dst)
	tls := th.dial(t, "127.0.0.1", dst)
	if _, err := tls.Write(hellotest.ClientHello(t, "a.test")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []net.Conn{tcp, tls} {
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return th.srv.tracker.len() == 2 })
	// The tls connection stays (a.test still allowed); the tcp one, allowed by git.test, goes.
	res := th.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	if res.ClosedConnections != 1 {
		t.Fatalf("closed %d connections, want 1", res.ClosedConnections)
	}
	_ = tcp.SetReadDeadline(time.Now().Add(hangGuard))
	if got := readAll(tcp); got != "ping" {
		t.Fatalf("cut tcp connection read %q, want its echo and then its end", got)
	}
	if th.srv.tracker.len() != 1 {
		t.Fatalf("tracked %d, want the tls connection", th.srv.tracker.len())
	}
	th.advance(time.Hour) // held while it lives: a swap back re-decides it on git.test
	if res := th.apply(`"public"`); res.ClosedConnections != 0 {
		t.Fatalf("public closed %d", res.ClosedConnections)
	}
}

// Refusals, connections that were not redirected and loops into the proxy are recorded
// as the explicit path's refusals are: one line, one metric increment, one /v1/blocked
// entry, with the protocol.
func TestTransparentRecords(t *testing.T) {
	th := newTransparentHarness(t)
	th.apply(allowA)
	listener := netip.MustParseAddrPort(th.srv.TransparentAddr().String())
	proxy := netip.MustParseAddrPort(th.srv.ProxyAddr().String())
	for i, tc := range []struct {
		name, policy string
		dst          netip.AddrPort
		hello        bool
		reason       string
		host         string
		protocol     string
	}{
		{name: "refused server name", policy: allowA, dst: ap(addrB, th.b.echoPort), hello: true, reason: "not-allowlisted", host: "b.test", protocol: "tls"},
		{name: "not redirected", policy: allowA, reason: ReasonNotRedirected, host: listener.Addr().String(), protocol: "tcp"},
		{name: "redirected to the listener itself", policy: allowA, dst: listener, reason: ReasonNotRedirected, host: listener.Addr().String(), protocol: "tcp"},
		{name: "a loop into the explicit proxy", policy: `"public"`, dst: proxy, reason: ReasonInternalAddress, host: proxy.Addr().String(), protocol: "tcp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := th.apply(tc.policy)
			before := promtest.ToFloat64(th.srv.metrics.requests.WithLabelValues(typeTransparent, "denied", tc.reason))
			c := th.dial(t, "127.0.0.1", tc.dst)
			if tc.hello {
				_, _ = c.Write(hellotest.ClientHello(t, "b.test"))
			}
			readAll(c)
			l := th.line(t, i+1)
			port := tc.dst.Port()
			if !tc.dst.IsValid() {
				port = listener.Port()
			}
			if l["decision"] != "denied" || l["reason"] != tc.reason || l["host"] != tc.host || l["protocol"] != tc.protocol || l["port"] != float64(port) {
				t.Fatalf("decision line %v", l)
			}
			if got := promtest.ToFloat64(th.srv.metrics.requests.WithLabelValues(typeTransparent, "denied", tc.reason)); got != before+1 {
				t.Fatalf("counted %v, want %v", got, before+1)
			}
			sum := th.srv.Current().blocked.Summary(rs.Generation)
			want := adminapi.BlockedTarget{Host: tc.host, Port: port, Type: typeTransparent, Reason: tc.reason, Protocol: tc.protocol, Count: 1}
			if len(sum.Top) != 1 || sum.Top[0] != want {
				t.Fatalf("blocked %+v, want %+v", sum.Top, want)
			}
		})
	}
}

// A head the front will not serve, on a transparent connection, is recorded as the
// transparent connection's: type transparent, protocol http, its original destination
// (it was recorded as an explicit proxy request, out of the transparent records).
func TestTransparentMalformedHeadRecord(t *testing.T) {
	th := newTransparentHarness(t)
	th.apply(allowA)
	dst := ap(addrA, th.a.httpPort)
	before := promtest.ToFloat64(th.srv.metrics.requests.WithLabelValues(typeTransparent, "denied", "malformed-request"))
	c := th.dial(t, "127.0.0.1", dst)
	fmt.Fprint(c, "GET /x HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n")
	if got := readAll(c); !strings.HasPrefix(got, "HTTP/1.1 400 ") {
		t.Fatalf("answer %q, want 400", got)
	}
	l := th.line(t, 1)
	if l["decision"] != "denied" || l["reason"] != "malformed-request" || l["protocol"] != "http" || l["original_dst"] != dst.String() {
		t.Fatalf("decision line %v", l)
	}
	if got := promtest.ToFloat64(th.srv.metrics.requests.WithLabelValues(typeTransparent, "denied", "malformed-request")); got != before+1 {
		t.Fatalf("counted %v, want %v", got, before+1)
	}
}

// The drain closes the transparent listener with the others and cuts its tunnels at
// the deadline.
func TestTransparentDrain(t *testing.T) {
	th := newTransparentHarness(t)
	th.apply(`{"network_mode":"allowlist","allowed_hosts":["127.0.0.2/32"]}`)
	c := th.dial(t, "127.0.0.1", ap(addrA, th.a.echoPort))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return th.srv.tracker.len() == 1 })
	addr := th.srv.TransparentAddr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := th.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readAll(c); got != "ping" {
		t.Fatalf("cut tunnel read %q, want its echo and then its end", got)
	}
	if nc, err := net.Dial("tcp", addr); err == nil {
		nc.Close()
		t.Fatal("the transparent listener still accepts after the drain")
	}
}

// Readiness requires the transparent listener to be serving.
func TestTransparentReadiness(t *testing.T) {
	th := newTransparentHarness(t)
	if ok, why := th.srv.Ready(); !ok {
		t.Fatalf("not ready: %s", why)
	}
	// Its accept loop starting a moment after Start is no reason for Start to log that
	// the sidecar would route packets.
	if strings.Contains(th.logs.String(), "would route packets") {
		t.Fatalf("start-up logged a routing sidecar:\n%s", th.logs.String())
	}
	th.srv.transparent.Close()
	waitFor(t, func() bool { ok, _ := th.srv.Ready(); return !ok })
	if _, why := th.srv.Ready(); why != "transparent listener not serving" {
		t.Fatalf("why %q", why)
	}
}

// A transparent HTTP request that a swap refuses between its decision and its dial is
// recorded as transparent, as its decision was.
func TestTransparentHTTPCutBySwapRecord(t *testing.T) {
	th := newTransparentHarness(t)
	th.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	req := httptest.NewRequest(http.MethodGet, "http://a.test/", nil)
	req.RemoteAddr = "127.0.0.1:5555"
	dst := netip.MustParseAddrPort("127.0.0.2:80")
	resp, err := th.srv.upstreamAnswer(req, &requestState{origin: dst}, &Verdict{Host: "a.test", Name: "a.test", Port: 80}, nil, upclient.ErrRecheckFailed)
	if err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("answer %v, %v; want the 403 of a refusal", resp, err)
	}
	l := th.line(t, 1)
	if l["reason"] != ReasonPolicyChanged || l["protocol"] != "http" || l["original_dst"] != dst.String() {
		t.Fatalf("decision line %v", l)
	}
	rs := th.srv.Current()
	if sum := rs.blocked.Summary(rs.Generation); len(sum.Top) != 1 || sum.Top[0].Type != typeTransparent || sum.Top[0].Protocol != "http" {
		t.Fatalf("blocked %+v", sum.Top)
	}
}
