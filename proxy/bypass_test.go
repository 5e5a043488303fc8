package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/compass-egress/compass-egress/adminapi"
	"github.com/compass-egress/compass-egress/net/addrguard"
	"github.com/compass-egress/compass-egress/policy"
)

// TestBypassVectors tries the known ways of smuggling a destination past a proxy. The
// policy allows a.test only; b.test (127.0.0.3) is the target an attacker wants.
func TestBypassVectors(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	ap, bp := h.a.httpPort, h.b.httpPort
	cases := []struct {
		name    string
		request string // raw bytes sent to the proxy
		want    string // substring of the answer
		notWant string // substring that must not appear (what the upstream would echo)
	}{
		{"decimal IPv4", fmt.Sprintf("GET http://2130706435:%d/ HTTP/1.1\r\nHost: 2130706435:%d\r\n\r\n", bp, bp), "reason=non-canonical-address", "local="},
		{"hex IPv4", fmt.Sprintf("GET http://0x7f.0.0.3:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", bp), "reason=non-canonical-address", "local="},
		{"octal IPv4", fmt.Sprintf("GET http://0177.0.0.3:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", bp), "reason=non-canonical-address", "local="},
		{"short IPv4", fmt.Sprintf("GET http://127.3:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", bp), "reason=non-canonical-address", "local="},
		{"CONNECT short IPv4", fmt.Sprintf("CONNECT 127.3:%d HTTP/1.1\r\nHost: x\r\n\r\n", bp), "reason=non-canonical-address", ""},
		{"CONNECT decimal IPv4", fmt.Sprintf("CONNECT 2130706435:%d HTTP/1.1\r\n\r\n", bp), "reason=non-canonical-address", ""},
		{"CONNECT hex IPv4", fmt.Sprintf("CONNECT 0x7f.0.0.3:%d HTTP/1.1\r\n\r\n", bp), "reason=non-canonical-address", ""},
		{"CONNECT octal IPv4", fmt.Sprintf("CONNECT 0177.0.0.3:%d HTTP/1.1\r\n\r\n", bp), "reason=non-canonical-address", ""},
		{"CONNECT IP literal of an allowed name", fmt.Sprintf("CONNECT 127.0.0.2:%d HTTP/1.1\r\n\r\n", ap), "reason=not-allowlisted", ""},
		{"GET IP literal of an allowed name", fmt.Sprintf("GET http://127.0.0.2:%d/ HTTP/1.1\r\nHost: a.test\r\n\r\n", ap), "reason=not-allowlisted", "local="},
		{"Host header names a denied host", fmt.Sprintf("GET http://a.test:%d/ HTTP/1.1\r\nHost: b.test:%d\r\nConnection: close\r\n\r\n", ap, bp), "reason=host-mismatch", "local="},
		{"Host header names an allowed host", fmt.Sprintf("GET http://b.test:%d/ HTTP/1.1\r\nHost: a.test:%d\r\nConnection: close\r\n\r\n", bp, ap), "reason=not-allowlisted", "local="},
		{"Host header names a denied host without a port", fmt.Sprintf("GET http://a.test:%d/ HTTP/1.1\r\nHost: b.test\r\nConnection: close\r\n\r\n", ap), "reason=host-mismatch", "local="},
		{"Host header names a denied address", fmt.Sprintf("GET http://a.test:%d/ HTTP/1.1\r\nHost: 127.0.0.3:%d\r\nConnection: close\r\n\r\n", ap, ap), "reason=host-mismatch", "local="},
		{"HTTP/1.0 without a Host header", fmt.Sprintf("GET http://a.test:%d/ HTTP/1.0\r\n\r\n", ap), "host=a.test:", ""},
		{"Host header with another port", fmt.Sprintf("GET http://a.test:%d/ HTTP/1.1\r\nHost: a.test:%d\r\nConnection: close\r\n\r\n", ap, bp), "reason=host-mismatch", "local="},
		{"Host header in another case, without the port", fmt.Sprintf("GET http://a.test:%d/ HTTP/1.1\r\nHost: A.Test.\r\nConnection: close\r\n\r\n", ap), "host=a.test:", ""},
		{"two Host headers", fmt.Sprintf("GET http://a.test:%d/ HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\nConnection: close\r\n\r\n", ap), "HTTP/1.1 400", "local="},
		{"HTTP/1.1 without a Host header", fmt.Sprintf("GET http://a.test:%d/ HTTP/1.1\r\nConnection: close\r\n\r\n", ap), "HTTP/1.1 400", "local="},
		{"Host header only (origin-form)", fmt.Sprintf("GET / HTTP/1.1\r\nHost: b.test:%d\r\n\r\n", bp), "reason=not-proxy-request", "local="},
		{"userinfo in authority", fmt.Sprintf("GET http://a.test:%d@b.test:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", ap, bp), "reason=userinfo", "local="},
		{"userinfo with allowed name last", fmt.Sprintf("GET http://b.test@a.test:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", ap), "reason=userinfo", "local="},
		{"CONNECT with userinfo, allowed name last", fmt.Sprintf("CONNECT b.test:%d@a.test:%d HTTP/1.1\r\n\r\n", bp, h.a.echoPort), "reason=userinfo", ""},
		{"absolute URI with another port", fmt.Sprintf("GET http://a.test:%d/ HTTP/1.1\r\nHost: a.test:%d\r\n\r\n", bp, ap), "", ""},
		{"trailing dot and case of a denied name", fmt.Sprintf("GET http://B.TEST.:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", bp), "reason=not-allowlisted", "local="},
		{"double trailing dot", fmt.Sprintf("GET http://a.test..:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", ap), "reason=invalid-host", "local="},
		// IDNA maps U+3002 to a dot for the decision; net/http would write the Host field
		// as punycode without that mapping (golang/go#80417): the upstream must be sent
		// the name decided.
		{"ideographic full stop in an allowed name", fmt.Sprintf("GET http://a\u3002test:%d/ HTTP/1.1\r\nHost: a.test:%d\r\n\r\n", ap, ap), fmt.Sprintf("host=a.test:%d local=127.0.0.2", ap), "xn--"},
		{"ideographic full stop in a denied name", fmt.Sprintf("GET http://b\u3002test:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", bp), "reason=not-allowlisted", "local="},
		{"CONNECT with an ideographic full stop in a denied name", fmt.Sprintf("CONNECT b\u3002test:%d HTTP/1.1\r\n\r\n", h.b.echoPort), "reason=not-allowlisted", ""},
		{"fullwidth digits of an address", fmt.Sprintf("GET http://\uff11\uff12\uff17\uff0e\uff10\uff0e\uff10\uff0e\uff13:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", bp), "HTTP/1.1 403", "local="},
		{"percent-encoded host", fmt.Sprintf("GET http://b%%2etest:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", bp), "HTTP/1.1 4", "local="},
		{"unbracketed IPv6", fmt.Sprintf("CONNECT ::ffff:127.0.0.3:%d HTTP/1.1\r\n\r\n", bp), "HTTP/1.1 4", ""},
		{"IPv6 zone", fmt.Sprintf("CONNECT [fe80::1%%25lo]:%d HTTP/1.1\r\n\r\n", bp), "403", ""},
		// A zone is not part of the destination: a matcher's ranges never contain a
		// zoned address, so it would pass a denylist's address rules.
		{"IPv6 zone in the absolute URI", fmt.Sprintf("GET http://[::1%%25lo]:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", ap), "reason=invalid-host", "local="},
		{"bracketed name", fmt.Sprintf("CONNECT [b.test]:%d HTTP/1.1\r\n\r\n", bp), "HTTP/1.1 4", ""},
		{"CONNECT without a port", "CONNECT a.test HTTP/1.1\r\n\r\n", "reason=invalid-port", ""},
		{"CONNECT with an absolute URI", fmt.Sprintf("CONNECT http://b.test:%d HTTP/1.1\r\n\r\n", bp), "HTTP/1.1 4", ""},
		{"CONNECT with a path", fmt.Sprintf("CONNECT a.test:%d/x HTTP/1.1\r\n\r\n", h.a.echoPort), "reason=invalid-host", ""},
		{"CONNECT with a query", fmt.Sprintf("CONNECT a.test:%d?x HTTP/1.1\r\n\r\n", h.a.echoPort), "reason=invalid-host", ""},
		{"CONNECT with a percent-encoded host", fmt.Sprintf("CONNECT a%%2etest:%d HTTP/1.1\r\n\r\n", h.a.echoPort), "HTTP/1.1 4", ""},
		{"request pipelined behind a refused CONNECT", fmt.Sprintf("CONNECT b.test:%d HTTP/1.1\r\n\r\nGET http://b.test:%d/ HTTP/1.1\r\nHost: b.test\r\n\r\n", bp, bp), "reason=not-allowlisted", "local="},
		{"request pipelined behind an allowed one", fmt.Sprintf("GET http://a.test:%d/ HTTP/1.1\r\nHost: a.test\r\n\r\nGET http://b.test:%d/ HTTP/1.1\r\nHost: b.test\r\nConnection: close\r\n\r\n", ap, bp), "reason=not-allowlisted", "local=127.0.0.3"},
		{"CONNECT port 0", "CONNECT a.test:0 HTTP/1.1\r\n\r\n", "reason=invalid-port", ""},
		{"CONNECT port out of range", "CONNECT a.test:70000 HTTP/1.1\r\n\r\n", "reason=invalid-port", ""},
		{"CONNECT port with a leading zero", fmt.Sprintf("CONNECT a.test:0%d HTTP/1.1\r\n\r\n", h.a.echoPort), "reason=invalid-port", ""},
		{"port with a leading zero", fmt.Sprintf("GET http://a.test:0%d/ HTTP/1.1\r\nHost: a.test:0%d\r\n\r\n", ap, ap), "reason=invalid-port", "local="},
		{"unsupported scheme", fmt.Sprintf("GET ftp://a.test:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", ap), "reason=unsupported-scheme", ""},
		{"h2c upgrade", fmt.Sprintf("GET http://a.test:%d/ HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n", ap), "reason=unsupported-upgrade", "local="},
		{"h2c upgrade in a second Upgrade field", fmt.Sprintf("GET http://a.test:%d/ HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nUpgrade: h2c\r\n\r\n", ap), "reason=unsupported-upgrade", "local="},
		{"h2c upgrade listed after websocket", fmt.Sprintf("GET http://a.test:%d/ HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket, h2c\r\n\r\n", ap), "reason=unsupported-upgrade", "local="},
		{"HTTP/2 prior knowledge", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "HTTP/1.1 505 ", "local="},
		{"garbage", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n", "HTTP/1.1 400", "local="},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.request
			if !strings.Contains(req, "Connection: close") && !strings.HasPrefix(req, "CONNECT") && !strings.HasPrefix(req, "PRI") && !strings.HasPrefix(req, "\x16") {
				req = strings.Replace(req, "\r\n\r\n", "\r\nConnection: close\r\n\r\n", 1)
			}
			out := h.raw(req)
			if tc.want == "" {
				// The port mismatch: a.test is allowed on every port, so this is
				// allowed, and the proxy must dial the port of the URI (where b's
				// server is not): nothing at 127.0.0.2 listens there.
				if strings.Contains(out, "local=127.0.0.3") {
					t.Fatalf("dialled another address: %q", out)
				}
				return
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("answer %q lacks %q", firstLine(out), tc.want)
			}
			if tc.notWant != "" && strings.Contains(out, tc.notWant) {
				t.Errorf("answer %q contains %q", out, tc.notWant)
			}
			if strings.Contains(out, " 407 ") {
				t.Errorf("a refusal must never be 407: %q", firstLine(out))
			}
		})
	}
	// An address in a non-canonical form is refused as written, never looked up as a
	// name (a resolver could answer 2130706435 with anything).
	for _, m := range h.dns.seenMsgs() {
		for _, q := range m.Question {
			if name := strings.TrimSuffix(q.Name, "."); name == "2130706435" || strings.HasPrefix(name, "0x7f") || strings.HasPrefix(name, "0177") || name == "127.3" {
				t.Errorf("the proxy looked up %q", q.Name)
			}
		}
	}
}

// TestPortMismatchWithPortRule: an allowlist rule for one port does not allow the same
// name on another port in the absolute URI, nor on the scheme's default port when the
// URI has none (80 for http, 443 for https).
func TestPortMismatchWithPortRule(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct{ rule, request string }{
		{fmt.Sprintf("a.test:%d", h.a.httpPort), fmt.Sprintf("GET http://a.test:%d/ HTTP/1.1\r\nHost: a.test:%d\r\nConnection: close\r\n\r\n", h.a.echoPort, h.a.httpPort)},
		{"a.test:443", "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n"},
		{"a.test:8080", "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n"},
		{"a.test:80", "GET https://a.test/ HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n"},
	} {
		h.apply(fmt.Sprintf(`{"network_mode":"allowlist","allowed_hosts":[%q]}`, tc.rule))
		if out := h.raw(tc.request); !strings.Contains(out, "reason=not-allowlisted") {
			t.Errorf("rule %s, %q: answer %q", tc.rule, firstLine(tc.request), firstLine(out))
		}
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\r\n")
	return line
}

// TestInternalAddressGuard: without --allow-internal, names that resolve to internal
// addresses and internal literals are refused unless an IP/CIDR rule names them.
func TestInternalAddressGuard(t *testing.T) {
	own := netip.MustParseAddr("192.0.2.77")
	h := newHarness(t, func(c *Config) {
		c.AllowInternal = []netip.Prefix{netip.MustParsePrefix("127.0.0.4/32")}
		c.OwnAddrs = []netip.Addr{own}
	})
	h.dns.set("meta.test", netip.MustParseAddr("169.254.169.254"))
	h.dns.set("self.test", own)
	h.dns.set("v6loop.test", netip.MustParseAddr("::1"))
	ap := h.a.httpPort
	cases := []struct {
		policy string
		target string
		reason string // "" = allowed
	}{
		{`"public"`, fmt.Sprintf("a.test:%d", ap), ReasonInternalAddress},
		{`"public"`, fmt.Sprintf("127.0.0.2:%d", ap), ReasonInternalAddress},
		{`"public"`, "meta.test:80", ReasonInternalAddress},
		{`"public"`, "169.254.169.254:80", ReasonInternalAddress},
		{`"public"`, "self.test:80", ReasonInternalAddress},
		{`"public"`, "v6loop.test:80", ReasonInternalAddress},
		{`"public"`, "[::1]:80", ReasonInternalAddress},
		{`"public"`, "0.0.0.0:80", ReasonInternalAddress},
		{`"public"`, "[::]:80", ReasonInternalAddress},
		{`"public"`, "224.0.0.1:80", ReasonInternalAddress},
		{`"public"`, "[fe80::1]:80", ReasonInternalAddress},
		{`"public"`, fmt.Sprintf("[::ffff:127.0.0.2]:%d", ap), ReasonInternalAddress},
		{`"public"`, "[64:ff9b::7f00:2]:80", ReasonInternalAddress},
		{`"public"`, "[64:ff9b:1::7f00:2]:80", ReasonInternalAddress},
		{`"public"`, "[2002:7f00:2::]:80", ReasonInternalAddress},
		{`"public"`, "[2001:0:4136:e378:8000:63bf:80ff:fffd]:80", ReasonInternalAddress},
		{`"public"`, "[::127.0.0.2]:80", ReasonInternalAddress},
		{`"public"`, "[fd00:ec2::254]:80", ReasonInternalAddress},
		{`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, fmt.Sprintf("a.test:%d", ap), ReasonInternalAddress},
		{`{"network_mode":"denylist","denied_hosts":[]}`, fmt.Sprintf("a.test:%d", ap), ReasonInternalAddress},
		// An explicit IP or CIDR rule lifts the guard for the addresses it covers.
		{`{"network_mode":"allowlist","allowed_hosts":["127.0.0.2"]}`, fmt.Sprintf("a.test:%d", ap), ""},
		{`{"network_mode":"allowlist","allowed_hosts":["127.0.0.0/30"]}`, fmt.Sprintf("127.0.0.2:%d", ap), ""},
		{`{"network_mode":"allowlist","allowed_hosts":["a.test", "127.0.0.3"]}`, fmt.Sprintf("a.test:%d", ap), ReasonInternalAddress},
		// The operator's exempt range.
		{`"public"`, fmt.Sprintf("x.svc.test:%d", h.c.httpPort), ""},
	}
	for _, tc := range cases {
		t.Run(tc.policy+" "+tc.target, func(t *testing.T) {
			h.apply(tc.policy)
			status, header := h.connectStatus(tc.target)
			checkOutcome(t, "CONNECT "+tc.target, status, header, tc.reason)
		})
	}
}

// rebindingResolver answers the first lookup of each name with first and every later
// one with later, the classic DNS-rebinding sequence.
type rebindingResolver struct {
	mu     sync.Mutex
	first  []netip.Addr
	later  []netip.Addr
	counts map[string]int
}

func (r *rebindingResolver) LookupNetIP(_ context.Context, name string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[name]++
	if r.counts[name] == 1 {
		return r.first, nil
	}
	return r.later, nil
}

// TestDNSRebinding: the proxy resolves once and dials the address it checked, so a
// resolver that turns to loopback after the check never gets its second answer used.
func TestDNSRebinding(t *testing.T) {
	res := &rebindingResolver{
		first:  []netip.Addr{netip.MustParseAddr("127.0.0.2")},
		later:  []netip.Addr{netip.MustParseAddr("127.0.0.1")},
		counts: map[string]int{},
	}
	h := newHarness(t, func(c *Config) {
		c.Resolver = res
		c.AllowInternal = []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}
	})
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["rebind.test"]}`)
	status, _, body := h.get(fmt.Sprintf("http://rebind.test:%d/", h.a.httpPort))
	if status != 200 || !strings.Contains(body, "local=127.0.0.2") {
		t.Fatalf("first request: %d %q", status, body)
	}
	if res.counts["rebind.test"] != 1 {
		t.Fatalf("resolved %d times for one request, want once", res.counts["rebind.test"])
	}
	// The next decision sees the rebound (loopback) answer and refuses it.
	status, header := h.connectStatus(fmt.Sprintf("rebind.test:%d", h.a.httpPort))
	if status != 403 || header != "denied; reason="+ReasonInternalAddress {
		t.Fatalf("rebound lookup: %d %q", status, header)
	}

	// A mixed answer: the loopback candidate is skipped, the checked one dialled.
	res.mu.Lock()
	res.first = []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")}
	res.counts = map[string]int{}
	res.mu.Unlock()
	status, _, body = h.get(fmt.Sprintf("http://rebind.test:%d/x", h.a.httpPort))
	if status != 200 || !strings.Contains(body, "local=127.0.0.2") {
		t.Fatalf("mixed answer: %d %q", status, body)
	}
}

// TestRefusedNamesAreNotResolved: a name no rule can allow never reaches a resolver.
func TestRefusedNamesAreNotResolved(t *testing.T) {
	res := &rebindingResolver{counts: map[string]int{}}
	h := newHarness(t, func(c *Config) { c.Resolver = res })
	for _, p := range []string{`"no-network"`, `{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, `{"network_mode":"denylist","denied_hosts":["exfil.test"]}`} {
		h.apply(p)
		if status, _ := h.connectStatus("secret.exfil.test:443"); p != `{"network_mode":"denylist","denied_hosts":["exfil.test"]}` && status != 403 {
			t.Fatalf("%s: status %d", p, status)
		}
		if status, _ := h.connectStatus("exfil.test:443"); status != 403 {
			t.Fatalf("%s: status %d", p, status)
		}
	}
	if res.counts["exfil.test"] != 0 {
		t.Fatalf("refused name was resolved %d times", res.counts["exfil.test"])
	}
}

// TestDecideRefusesInvalidUTF8Host: a target whose host is not valid UTF-8 (net/http
// passes such bytes, raw or %-decoded, through a CONNECT target or an absolute URI's
// authority) is an invalid host, refused before any lookup. It was canonicalised into
// a punycode name of U+FFFD that the client never wrote ("a.xn--b-q10i.test" for
// "a.b\xff.test", and for "a.b\xfe.test" too), looked up and, under a denylist,
// allowed.
func TestDecideRefusesInvalidUTF8Host(t *testing.T) {
	p, err := policy.Parse([]byte(`{"network_mode":"denylist","denied_hosts":["evil.test"]}`))
	if err != nil {
		t.Fatal(err)
	}
	rs := &RuleSet{Policy: p, Matcher: policy.Compile(p), addrPorts: newAddrRulePorts(p)}
	for _, host := range []string{"a.b\xff.test", "a.b\xfe.test", "\xff"} {
		res := &rebindingResolver{first: []netip.Addr{netip.MustParseAddr("127.0.0.2")}, counts: map[string]int{}}
		d := &Decider{Resolver: res, Guard: addrguard.New(addrguard.Config{})}
		v := d.Decide(context.Background(), rs, host, 443)
		if v.Allowed || v.Reason != ReasonInvalidHost || len(res.counts) > 0 {
			t.Errorf("Decide(%q) = allowed %v, reason %q, looked up %v; want refused as %s with no lookup", host, v.Allowed, v.Reason, res.counts, ReasonInvalidHost)
		}
	}
}

// TestRefusalsNameTheTargetAsWritten: a target refused for its form (userinfo, a path
// after a CONNECT authority, no authority net/http could read) is logged and listed in
// /v1/blocked as the client wrote it. net/http's reading of it is the allowed a.test,
// or no host at all, so logging that would leave b.test, the destination sought, out
// of every record.
func TestRefusalsNameTheTargetAsWritten(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	ap, bp := h.a.echoPort, h.b.httpPort
	cases := []struct {
		name, request, host string
	}{
		{"CONNECT with userinfo", fmt.Sprintf("CONNECT b.test:%d@a.test:%d HTTP/1.1\r\n\r\n", bp, ap), fmt.Sprintf("b.test:xxxxx@a.test:%d", ap)},
		{"CONNECT with a user name", fmt.Sprintf("CONNECT b.test@a.test:%d HTTP/1.1\r\n\r\n", ap), fmt.Sprintf("b.test@a.test:%d", ap)},
		{"CONNECT with a path", fmt.Sprintf("CONNECT a.test:%d/../b.test:%d HTTP/1.1\r\n\r\n", ap, bp), fmt.Sprintf("a.test:%d/../b.test:%d", ap, bp)},
		{"absolute URI with userinfo", fmt.Sprintf("GET http://b.test:%d@a.test:%d/ HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n", bp, ap), fmt.Sprintf("b.test:xxxxx@a.test:%d", ap)},
		{"absolute URI with a password", fmt.Sprintf("GET http://me:s3cret@a.test:%d/ HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n", ap), fmt.Sprintf("me:xxxxx@a.test:%d", ap)},
		{"CONNECT in lower case", fmt.Sprintf("connect b.test:%d HTTP/1.1\r\nHost: b.test\r\nConnection: close\r\n\r\n", bp), fmt.Sprintf("b.test:%d", bp)},
		{"URI without an authority", fmt.Sprintf("GET http:b.test:%d/ HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n", bp), fmt.Sprintf("http:b.test:%d/", bp)},
		// Written so that net/http reads no userinfo, yet a URI parser, a log reader
		// or the client took the part before an @ for one: its password is masked too.
		{"CONNECT an absolute URI with a password", fmt.Sprintf("CONNECT http://me:s3cret@a.test:%d HTTP/1.1\r\n\r\n", ap), fmt.Sprintf("http://me:xxxxx@a.test:%d", ap)},
		{"CONNECT with a path holding a password", fmt.Sprintf("CONNECT a.test:%d/me:s3cret@b.test HTTP/1.1\r\n\r\n", ap), fmt.Sprintf("a.test:%d/me:xxxxx@b.test", ap)},
		{"URI without an authority, with a password", "GET http:me:s3cret@b.test/ HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n", "http:xxxxx@b.test/"},
		{"URI with an empty authority, with a password", "GET http:///me:s3cret@b.test/ HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n", "http:///me:xxxxx@b.test/"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := len(logLines(h.logs.String(), "decision"))
			out := h.raw(tc.request)
			if !strings.Contains(out, " 403 ") {
				t.Fatalf("answer %q, want 403", firstLine(out))
			}
			var lines []map[string]any
			waitFor(t, func() bool { lines = logLines(h.logs.String(), "decision"); return len(lines) > before })
			if got := lines[before]["host"]; got != tc.host {
				t.Errorf("decision line host %q, want %q", got, tc.host)
			}
			listed := func(e adminapi.BlockedTarget) bool { return e.Host == tc.host }
			if !slices.ContainsFunc(h.srv.current.Load().blocked.Summary(0).Top, listed) {
				t.Errorf("/v1/blocked does not list %q", tc.host)
			}
		})
	}
	if strings.Contains(h.logs.String(), "s3cret") {
		t.Error("a password of a refused URI's userinfo reached the log")
	}
}
