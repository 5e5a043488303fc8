package proxy

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
)

// TestBroadRulesDoNotLiftGuard: only a rule inside an internal class lifts the guard
// for it; catch-all ranges, IPv4-mapped spellings, IPv4-embedding forms and the proxy's
// own addresses stay refused.
func TestBroadRulesDoNotLiftGuard(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.AllowInternal = nil })
	h.dns.set("inside.test", netip.MustParseAddr("127.0.0.2"))
	h.dns.set("mapped.test", netip.MustParseAddr("::ffff:127.0.0.2"))
	echo := h.a.echoPort
	self := h.srv.ProxyAddr().String()
	cases := []struct {
		policy string
		target string
		reason string // "" = allowed
	}{
		{`{"network_mode":"allowlist","allowed_hosts":["0.0.0.0/0","::/0"]}`, fmt.Sprintf("127.0.0.2:%d", echo), ReasonInternalAddress},
		{`{"network_mode":"allowlist","allowed_hosts":["0.0.0.0/0","::/0"]}`, fmt.Sprintf("inside.test:%d", echo), ReasonInternalAddress},
		{`{"network_mode":"allowlist","allowed_hosts":["0.0.0.0/0","::/0"]}`, fmt.Sprintf("mapped.test:%d", echo), ReasonInternalAddress},
		{`{"network_mode":"allowlist","allowed_hosts":["0.0.0.0/0","::/0"]}`, self, ReasonInternalAddress},
		{`{"network_mode":"allowlist","allowed_hosts":["::fffe:0:0/95"]}`, fmt.Sprintf("[::ffff:127.0.0.2]:%d", echo), "not-allowlisted"},
		{`{"network_mode":"allowlist","allowed_hosts":["64:ff9b::/96"]}`, "[64:ff9b::7f00:2]:80", ReasonInternalAddress},
		{`{"network_mode":"allowlist","allowed_hosts":["::ffff:0:0:0/96"]}`, "[::ffff:0:7f00:2]:80", ReasonInternalAddress},
		{`{"network_mode":"allowlist","allowed_hosts":["198.51.100.0/24","127.0.0.0/8"]}`, self, ReasonInternalAddress},
		{`{"network_mode":"allowlist","allowed_hosts":["127.0.0.1"]}`, self, ReasonInternalAddress},
		// A rule inside the class lifts it, whatever spelling the client uses.
		{`{"network_mode":"allowlist","allowed_hosts":["127.0.0.0/8"]}`, fmt.Sprintf("127.0.0.2:%d", echo), ""},
		{`{"network_mode":"allowlist","allowed_hosts":["127.0.0.0/8"]}`, fmt.Sprintf("[::ffff:127.0.0.2]:%d", echo), ""},
		{`{"network_mode":"allowlist","allowed_hosts":["127.0.0.0/8"]}`, fmt.Sprintf("mapped.test:%d", echo), ""},
		{`{"network_mode":"allowlist","allowed_hosts":["0.0.0.0/0","127.0.0.2"]}`, fmt.Sprintf("inside.test:%d", echo), ""},
	}
	for _, tc := range cases {
		t.Run(tc.policy+" "+tc.target, func(t *testing.T) {
			h.apply(tc.policy)
			status, header := h.connectStatus(tc.target)
			checkOutcome(t, "CONNECT "+tc.target, status, header, tc.reason)
		})
	}
}

// TestSwapCutsWhatOnlyALiftedGuardAllowed: a tunnel to an internal address that an IP
// rule let through is cut by a swap to a set whose rules still allow its name but no
// longer lift the guard; one whose set keeps a lifting rule stays.
func TestSwapCutsWhatOnlyALiftedGuardAllowed(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.AllowInternal = nil })
	for _, tc := range []struct {
		after string
		cut   bool
	}{
		{`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, true},
		{`{"network_mode":"denylist","denied_hosts":[]}`, true},
		{`"public"`, true},
		{`{"network_mode":"allowlist","allowed_hosts":["a.test","127.0.0.0/30"]}`, false},
	} {
		t.Run(tc.after, func(t *testing.T) {
			// The tunnel a previous case cut is gone before this one counts cuts.
			waitFor(t, func() bool { return h.srv.tracker.len() == 0 })
			h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test","127.0.0.2"]}`)
			resp, tunnel := h.connect(h.a.echoHostPort("a.test"), "")
			if tunnel == nil {
				t.Fatalf("CONNECT a.test: %d %s", resp.StatusCode, resp.Header.Get("X-Compass-Egress"))
			}
			defer tunnel.Close()
			echoRoundTrip(t, tunnel, "before")
			res := h.apply(tc.after)
			if want := map[bool]uint64{true: 1, false: 0}[tc.cut]; res.ClosedConnections != want {
				t.Fatalf("closed %d connections, want %d", res.ClosedConnections, want)
			}
			if !tc.cut {
				echoRoundTrip(t, tunnel, "after")
			}
		})
	}
}

// TestOwnListenersRefusedDespiteAllowInternal: --allow-internal opens a loopback range
// for tests, never a loop into the proxy's own listeners.
func TestOwnListenersRefusedDespiteAllowInternal(t *testing.T) {
	h := newHarness(t) // --allow-internal 127.0.0.0/8
	h.apply(`"public"`)
	_, dnsPort, _ := net.SplitHostPort(h.srv.DNSAddr().String())
	_, metricsPort, _ := net.SplitHostPort(h.srv.MetricsAddr().String())
	for _, target := range []string{h.srv.ProxyAddr().String(), "127.0.0.1:" + dnsPort, "127.0.0.1:" + metricsPort} {
		status, header := h.connectStatus(target)
		checkOutcome(t, "CONNECT "+target, status, header, ReasonInternalAddress)
	}
	status, header := h.connectStatus(h.a.echoHostPort("127.0.0.2"))
	checkOutcome(t, "CONNECT exempt upstream", status, header, "")
}

// TestDNSFilterUnmapsAnswers: an AAAA record spelling an IPv4 address as IPv4-mapped
// IPv6 is matched as that IPv4 address, not by an IPv6 range around ::ffff:0:0/96.
func TestDNSFilterUnmapsAnswers(t *testing.T) {
	h := newHarness(t)
	h.dns.set("mapped.test", netip.MustParseAddr("::ffff:127.0.0.2"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["::fffe:0:0/95"]}`)
	if r := h.query("mapped.test", dns.TypeAAAA, "udp"); r.Rcode != dns.RcodeRefused {
		t.Errorf("::fffe:0:0/95 rule: rcode %s, want REFUSED", dns.RcodeToString[r.Rcode])
	}
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["127.0.0.2"]}`)
	if r := h.query("mapped.test", dns.TypeAAAA, "udp"); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Errorf("127.0.0.2 rule: rcode %s, %d answers, want the record", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	// A denylist's IPv4 rule denies the mapped spelling too.
	h.apply(`{"network_mode":"denylist","denied_hosts":["127.0.0.2"]}`)
	if r := h.query("mapped.test", dns.TypeAAAA, "udp"); r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
		t.Errorf("127.0.0.2 denied: rcode %s, %d answers, want REFUSED", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
}
