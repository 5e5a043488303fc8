package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/miekg/dns"
)

// Vectors from public advisories of other egress proxies and SSRF filters that the
// older bypass tests (bypass_test.go, smuggling_test.go, guard_test.go, ...) do not
// send. Each names its source; docs/proxy.md and the report of the audit that added
// them say which were covered already.

// TestAdvisoryDenylistSpellings: a denylist only takes away, so any spelling of a denied
// name that the proxy read as another name, while the resolver and the upstream read it
// as the denied one, would be a way out. smokescreen had two such bypasses of its deny
// list: a trailing dot or another letter case (CVE-2022-24825, GHSA-gcj7-j438-hjj2) and
// a name in square brackets (CVE-2022-29188, GHSA-qwrf-gfpj-qvj6); Go's url.Parse took
// non-addresses in brackets until CVE-2025-47912. IDNA maps fullwidth letters, the
// ideographic and fullwidth full stops and ignorable code points onto the ASCII name
// (docs/policy.md §2: "IDN names compare in punycode"), so each is the denied name,
// refused as denylisted, over CONNECT, an absolute URI and the DNS server alike. The
// allowlist tests of these spellings (TestBypassVectors) cannot tell "denied as b.test"
// from "denied as some other name": an allowlist refuses both.
func TestDenylistSpellings(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"denylist","denied_hosts":["b.test","*.svc.test"]}`)
	cases := []struct {
		name, host string
		svc        bool   // a name under *.svc.test (c's upstream), else b.test
		reason     string // the refusal's reason; "": any 4xx (net/http's parser refuses first)
	}{
		{"fullwidth letter", "\uff42.test", false, "denylisted"},
		{"fullwidth capitals", "\uff22.\uff34\uff25\uff33\uff34", false, "denylisted"},
		{"ideographic full stop", "b\u3002test", false, "denylisted"},
		{"fullwidth full stop", "b\uff0etest", false, "denylisted"},
		{"halfwidth ideographic full stop", "b\uff61test", false, "denylisted"},
		{"trailing ideographic full stop", "b.test\u3002", false, "denylisted"},
		{"soft hyphen", "b\u00ad.test", false, "denylisted"},
		{"zero-width joiner", "b\u200d.test", false, "invalid-host"}, // CONTEXTJ: not a valid name, never b.test
		{"capitals and trailing dot under a wildcard", "X.SVC.TEST.", true, "denylisted"},
		{"fullwidth full stops under a wildcard", "x\uff0esvc\uff0etest", true, "denylisted"},
		{"fullwidth letter under a wildcard", "\uff58.svc.test", true, "denylisted"},
		// Refused by net/http's parser since Go's fix of CVE-2025-47912 (a 400), and by
		// splitAuthority behind it (TestSplitAuthority).
		{"name in brackets", "[b.test]", false, ""}, // smokescreen CVE-2022-29188
		{"name in brackets under a wildcard", "[x.svc.test]", true, ""},
		// Brackets inside the host: CPython's urlparse read the part between them as the
		// host name (CVE-2025-0938, python/cpython#105704).
		{"bracketed name after a prefix", "prefix.[b.test]", false, ""},
		{"bracketed name before a suffix", "[b.test].postfix", false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up, local := h.b, "local=127.0.0.3"
			if tc.svc {
				up, local = h.c, "local=127.0.0.4"
			}
			authority := func(port uint16) string { return fmt.Sprintf("%s:%d", tc.host, port) }
			// CONNECT: the echo server would answer a tunnel.
			out := h.raw(fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", authority(up.echoPort), authority(up.echoPort)))
			checkSpelling(t, "CONNECT", out, tc.reason)
			// An absolute URI: the HTTP server would say where it runs.
			out = h.raw(fmt.Sprintf("GET http://%s/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", authority(up.httpPort), authority(up.httpPort)))
			checkSpelling(t, "GET", out, tc.reason)
			if strings.Contains(out, local) {
				t.Errorf("GET reached the denied upstream: %q", out)
			}
		})
	}
	// The DNS server: the sandbox's resolver may ask in any case (0x20 randomisation).
	for _, name := range []string{"B.TEST", "b.TeSt", "X.Svc.TEST", "deep.X.svc.test"} {
		r := h.query(name, dns.TypeA, "udp")
		if code, ok := ede(r); r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 || !ok || code != dns.ExtendedErrorCodeBlocked {
			t.Errorf("DNS %s: rcode %s, %d answers, EDE %d %v; want REFUSED, Blocked", name, dns.RcodeToString[r.Rcode], len(r.Answer), code, ok)
		}
	}
	// The names an allowed spelling must still work: the denylist denies names, not
	// everything that looks unusual.
	if status, header, body := h.get(fmt.Sprintf("http://A.TEST.:%d/", h.a.httpPort)); status != 200 || !strings.Contains(body, "local=127.0.0.2") {
		t.Errorf("allowed A.TEST.: %d %q %q", status, header, body)
	}
}

// checkSpelling checks the answer to one spelling of a denied name: a 403 for the
// reason given, or (reason "") any 4xx; never a 200 or a relayed answer.
func checkSpelling(t *testing.T, what, out, reason string) {
	t.Helper()
	line := firstLine(out)
	switch {
	case reason != "" && !(strings.HasPrefix(line, "HTTP/1.1 403 ") && strings.Contains(out, "X-Compass-Egress: denied; reason="+reason+"\r\n")):
		t.Errorf("%s: answer %q, want 403 %s:\n%s", what, line, reason, out)
	case reason == "" && !strings.HasPrefix(line, "HTTP/1.1 4"):
		t.Errorf("%s: answer %q, want a 4xx refusal", what, line)
	}
}

// redirectUpstream answers every request with status and Location loc, and counts the
// requests it read and the Host fields they carried.
type redirectUpstream struct {
	mu    sync.Mutex
	hosts []string
}

func (u *redirectUpstream) seen() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.hosts...)
}

// TestAdvisoryRedirectsAreRelayedNotFollowed: "SSRF via redirect" (an allowed server
// answers 3xx to an internal or denied address, and the fetcher follows it after the
// check) is the most common SSRF-filter bypass in the write-ups (OWASP SSRF prevention;
// PortSwigger "SSRF with filter bypass via open redirection"). The proxy must relay the
// redirect to the client, which then asks the proxy for the new target and is decided
// afresh; it must never follow one itself, on either of its upstream paths (the
// upstream client for a GET, net/http's Transport for a request with a body).
func TestRedirectsAreRelayedNotFollowed(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	// b.test's address, denied: counts every connection.
	bHits := make(chan struct{}, 64)
	b := serveTCP(t, "127.0.0.3", func(net.Conn, <-chan struct{}) {
		select {
		case bHits <- struct{}{}:
		default:
		}
	})
	up := &redirectUpstream{}
	var status, location string
	var mu sync.Mutex
	a := serveRawHTTP(t, "127.0.0.2", func(c net.Conn, req *http.Request) bool {
		_, _ = io.Copy(io.Discard, req.Body)
		up.mu.Lock()
		up.hosts = append(up.hosts, req.Host)
		up.mu.Unlock()
		mu.Lock()
		st, loc := status, location
		mu.Unlock()
		_, err := fmt.Fprintf(c, "HTTP/1.1 %s\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n", st, loc)
		return err == nil
	})
	aHost := fmt.Sprintf("a.test:%d", a.Port)
	targets := []string{
		fmt.Sprintf("http://b.test:%d/", b.Port),
		fmt.Sprintf("http://127.0.0.3:%d/", b.Port),
		fmt.Sprintf("http://[::ffff:127.0.0.3]:%d/", b.Port),
		"http://169.254.169.254/latest/meta-data/",
		"http://" + h.srv.ProxyAddr().String() + "/",
	}
	requests := []struct {
		name, status, request string
	}{
		{"GET 302", "302 Found", "GET http://" + aHost + "/r HTTP/1.1\r\nHost: " + aHost + "\r\n\r\n"},
		{"HEAD 301", "301 Moved Permanently", "HEAD http://" + aHost + "/r HTTP/1.1\r\nHost: " + aHost + "\r\n\r\n"},
		{"POST 307", "307 Temporary Redirect", "POST http://" + aHost + "/r HTTP/1.1\r\nHost: " + aHost + "\r\nContent-Length: 2\r\n\r\nhi"},
		{"POST 303", "303 See Other", "POST http://" + aHost + "/r HTTP/1.1\r\nHost: " + aHost + "\r\nContent-Length: 2\r\n\r\nhi"},
		{"PUT 308", "308 Permanent Redirect", "PUT http://" + aHost + "/r HTTP/1.1\r\nHost: " + aHost + "\r\nContent-Length: 2\r\n\r\nhi"},
	}
	for _, rq := range requests {
		for _, target := range targets {
			t.Run(rq.name+" to "+target, func(t *testing.T) {
				mu.Lock()
				status, location = rq.status, target
				mu.Unlock()
				before := len(up.seen())
				c := h.dialProxy(t)
				if _, err := io.WriteString(c, rq.request); err != nil {
					t.Fatal(err)
				}
				method, _, _ := strings.Cut(rq.request, " ")
				resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
				if err != nil {
					t.Fatalf("no answer: %v", err)
				}
				resp.Body.Close()
				if got := resp.Status; got != rq.status || resp.Header.Get("Location") != target {
					t.Errorf("answer %q Location %q, want the upstream's %q to %s relayed", got, resp.Header.Get("Location"), rq.status, target)
				}
				if e := resp.Header.Get("X-Compass-Egress"); e != "" {
					t.Errorf("the relayed redirect carries X-Compass-Egress %q", e)
				}
				if seen := up.seen()[before:]; len(seen) != 1 || seen[0] != aHost {
					t.Errorf("the allowed upstream read %q for one request, want [%s]: the redirect was followed to it", seen, aHost)
				}
			})
		}
	}
	select {
	case <-bHits:
		t.Error("a connection reached the denied address the redirects named")
	default:
	}
}

// TestAdvisoryNonProxyRequestTargets: request targets that a lenient proxy reads as a
// destination (squid and tinyproxy in transparent/intercept mode route origin-form by
// its Host field; RFC 9112 §3.2.4 asterisk-form), or that URL parsers split otherwise
// than net/http (backslashes, a '#' or '?' before an '@': Orange Tsai, "A New Era of
// SSRF", Black Hat 2017; Claroty/Snyk "Exploiting URL Parsing Confusion", 2022; HAProxy
// CVE-2023-45539 and Envoy CVE-2021-32779, '#' in the target). The Host field names
// the allowed a.test here: a proxy that fell back on it would reach a.test, so only a
// refusal for the target itself passes. Nothing reaches b.test either way.
func TestNonProxyRequestTargets(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	ap, bp := h.a.httpPort, h.b.httpPort
	aHost := fmt.Sprintf("a.test:%d", ap)
	cases := []struct {
		name, target string
		want         string // substring of the answer ("X-Compass-Egress: denied; reason=..." or a status line)
		reached      string // the upstream the answer must come from, if any
	}{
		{"asterisk-form OPTIONS", "*", "reason=not-proxy-request", ""},
		{"origin-form with an allowed Host", "/", "reason=not-proxy-request", ""},
		{"network-path reference", fmt.Sprintf("//a.test:%d/", ap), "reason=not-proxy-request", ""},
		{"absolute URI inside a path", fmt.Sprintf("/http://a.test:%d/", ap), "reason=not-proxy-request", ""},
		{"scheme with one slash", fmt.Sprintf("http:/a.test:%d/", ap), "reason=invalid-host", ""},
		{"scheme with backslashes", fmt.Sprintf("http:\\\\a.test:%d\\", ap), "reason=invalid-host", ""},
		{"backslash before an @", fmt.Sprintf("http://a.test:%d\\@b.test:%d/", ap, bp), "HTTP/1.1 4", ""},
		{"backslash inside the host", fmt.Sprintf("http://b.test\\.a.test:%d/", ap), "HTTP/1.1 4", ""},
		{"'#' before an @, denied name first", fmt.Sprintf("http://b.test:%d#@a.test:%d/", bp, ap), "HTTP/1.1 4", ""},
		{"'#' before an @, allowed name first", fmt.Sprintf("http://a.test:%d#@b.test:%d/", ap, bp), "HTTP/1.1 4", ""},
		// The query begins at '?' for net/http and for WHATWG alike: a.test is the
		// destination, and the bytes after the '?' reach it as its query.
		{"'?' before an @", fmt.Sprintf("http://a.test:%d?@b.test:%d/", ap, bp), "host=" + aHost, "local=127.0.0.2"},
		{"scheme in capitals", fmt.Sprintf("HTTP://b.test:%d/", bp), "reason=not-allowlisted", ""}, // Envoy CVE-2023-35944
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			method := "GET"
			if tc.target == "*" {
				method = "OPTIONS"
			}
			out := h.raw(fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", method, tc.target, aHost))
			if !strings.Contains(out, tc.want) {
				t.Errorf("answer %q lacks %q", firstLine(out), tc.want)
			}
			if tc.reached == "" && strings.Contains(out, "local=") {
				t.Errorf("an upstream answered: %q", out)
			}
			if tc.reached != "" && !strings.Contains(out, tc.reached) {
				t.Errorf("answer %q, want it from %s", out, tc.reached)
			}
			if strings.Contains(out, "local=127.0.0.3") {
				t.Errorf("the denied upstream answered: %q", out)
			}
		})
	}
}

// TestAdvisoryForwardingLoop: a forwarded request to the proxy's own listeners (squid's
// "forwarding loop", and for the metrics listener a read of the sidecar's own counters
// from the sandbox) is refused on the HTTP path as it is for CONNECT
// (TestOwnListenersRefusedDespiteAllowInternal), whatever spelling of the address the
// URI uses, even with loopback exempt by --allow-internal. An empty host, which Go's
// dialler would read as the local system, is no host at all.
func TestForwardingLoop(t *testing.T) {
	h := newHarness(t) // --allow-internal 127.0.0.0/8
	h.apply(`"public"`)
	h.dns.set("loop.test", netip.MustParseAddr("127.0.0.1"))
	_, metricsPort, _ := net.SplitHostPort(h.srv.MetricsAddr().String())
	_, proxyPort, _ := net.SplitHostPort(h.srv.ProxyAddr().String())
	cases := []struct{ name, uri, reason string }{
		{"metrics listener", "http://127.0.0.1:" + metricsPort + "/metrics", ReasonInternalAddress},
		{"metrics listener, IPv4-mapped", "http://[::ffff:127.0.0.1]:" + metricsPort + "/metrics", ReasonInternalAddress},
		{"metrics listener by a name", "http://loop.test:" + metricsPort + "/metrics", ReasonInternalAddress},
		{"metrics listener, unspecified address", "http://0.0.0.0:" + metricsPort + "/metrics", ReasonInternalAddress},
		{"proxy listener", "http://127.0.0.1:" + proxyPort + "/", ReasonInternalAddress},
		{"proxy listener by a name", "http://loop.test:" + proxyPort + "/", ReasonInternalAddress},
		{"empty host", "http://:" + metricsPort + "/metrics", ReasonInvalidHost},
	}
	for _, tc := range cases {
		for _, method := range []string{"GET", "POST"} { // the upstream client; the Transport
			t.Run(tc.name+" "+method, func(t *testing.T) {
				body := ""
				if method == "POST" {
					body = "Content-Length: 0\r\n"
				}
				host := strings.TrimPrefix(tc.uri, "http://")
				host, _, _ = strings.Cut(host, "/")
				out := h.raw(fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n", method, tc.uri, host, body))
				if !strings.HasPrefix(out, "HTTP/1.1 403 ") || !strings.Contains(out, "X-Compass-Egress: denied; reason="+tc.reason+"\r\n") {
					t.Errorf("answer %q, want 403 %s:\n%s", firstLine(out), tc.reason, out)
				}
				if strings.Contains(out, "compass_proxy_") {
					t.Errorf("the sidecar's metrics were relayed to the client")
				}
			})
		}
	}
	// CONNECT with an empty host (Go's dialler: the local system).
	status, header := h.connectStatus(":" + metricsPort)
	checkOutcome(t, "CONNECT :"+metricsPort, status, header, ReasonInvalidHost)
}

// TestAdvisoryDenylistNamesNotServers pins what docs/proxy.md's security notes say of a
// denylist: a host rule denies the name asked for, so the same server by its address
// literal or under another name (alias.test resolves to b.test's address) is reached;
// an IP rule for that address denies all three, whatever name led to it.
func TestDenylistNamesNotServers(t *testing.T) {
	h := newHarness(t)
	h.dns.set("alias.test", netip.MustParseAddr("127.0.0.3"))
	targets := []string{h.b.echoHostPort("b.test"), h.b.echoHostPort("127.0.0.3"), h.b.echoHostPort("alias.test")}
	for _, tc := range []struct {
		policy  string
		reasons []string // per target; "" = allowed
	}{
		{`{"network_mode":"denylist","denied_hosts":["b.test"]}`, []string{"denylisted", "", ""}},
		{`{"network_mode":"denylist","denied_hosts":["b.test","127.0.0.3"]}`, []string{"denylisted", "denylisted", "denylisted"}},
	} {
		h.apply(tc.policy)
		for i, target := range targets {
			status, header := h.connectStatus(target)
			checkOutcome(t, tc.policy+" CONNECT "+target, status, header, tc.reasons[i])
		}
	}
}

// TestAdvisoryHostFieldWhitespaceAndLists: Envoy matched "example.com " as another
// string than "example.com" (CVE-2019-18802, GHSA-356m-vhw2-wcm4), and servers that
// join repeated fields read "a, b" as a list. The Host field is compared in canonical
// form after net/http trims its whitespace: trailing whitespace changes nothing, and a
// list is no single destination.
func TestHostFieldWhitespaceAndLists(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	ap, bp := h.a.httpPort, h.b.httpPort
	for _, tc := range []struct{ field, want string }{
		{fmt.Sprintf("a.test:%d \t", ap), "local=127.0.0.2"},
		{fmt.Sprintf("b.test:%d ", ap), "reason=host-mismatch"},
		{fmt.Sprintf("b.test:%d\t", bp), "reason=host-mismatch"},
		{fmt.Sprintf("a.test:%d, b.test:%d", ap, bp), "reason=host-mismatch"},
		{fmt.Sprintf("b.test:%d, a.test:%d", bp, ap), "reason=host-mismatch"},
	} {
		out := h.raw(fmt.Sprintf("GET http://a.test:%d/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", ap, tc.field))
		if !strings.Contains(out, tc.want) {
			t.Errorf("Host %q: answer %q lacks %q", tc.field, firstLine(out), tc.want)
		}
		if tc.want != "local=127.0.0.2" && strings.Contains(out, "local=") {
			t.Errorf("Host %q: an upstream answered: %q", tc.field, out)
		}
	}
}
