package proxy

import (
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/proxy/dnsserver"
	"github.com/compass-egress/compass-egress/proxy/internal/dnstest"
)

// A UDP answer is truncated to the size the client can take: its EDNS UDP size, 512
// bytes without EDNS (RFC 6891). Neither a cut answer to a client that said it takes
// more nor an oversize datagram to one that did not.
func TestUDPAnswerFitsTheClientsSize(t *testing.T) {
	upstream := tcpAnswerUpstream(t, func(name string) []dns.RR { return dnstest.AddrRecords(name, 60) })
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream} })
	h.apply(`"public"`)
	for _, tc := range []struct {
		name      string
		edns      uint16 // 0: no EDNS
		truncated bool
	}{
		{"edns 4096", 4096, false},
		{"no edns", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := new(dns.Msg)
			m.SetQuestion("many.test.", dns.TypeA)
			if tc.edns > 0 {
				m.SetEdns0(tc.edns, false)
			}
			resp, _, err := (&dns.Client{Net: "udp", UDPSize: 4096, Timeout: hangGuard}).Exchange(m, h.srv.DNSAddr().String())
			if err != nil {
				t.Fatal(err)
			}
			if resp.Truncated != tc.truncated || (len(resp.Answer) == 60) == tc.truncated {
				t.Fatalf("TC %v with %d of 60 records, want TC %v", resp.Truncated, len(resp.Answer), tc.truncated)
			}
		})
	}
}

// Every DNS answer is counted under its decision and bounded qtype: a refusal as
// denied, a forwarded answer as allowed.
func TestDNSQueriesCountedByDecision(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	if r := h.query("a.test", dns.TypeA, "udp"); r.Rcode != dns.RcodeSuccess {
		t.Fatalf("a.test: %v", r)
	}
	if r := h.query("b.test", dns.TypeAAAA, "udp"); r.Rcode != dns.RcodeRefused {
		t.Fatalf("b.test: %v", r)
	}
	// Counted once the answer is written: wait for both.
	for _, tc := range []struct{ decision, qtype string }{{"allowed", "A"}, {"denied", "AAAA"}} {
		waitFor(t, func() bool {
			return testutil.ToFloat64(h.srv.metrics.dnsQueries.WithLabelValues(tc.decision, tc.qtype)) == 1
		})
	}
	for _, tc := range []struct{ decision, qtype string }{{"denied", "A"}, {"allowed", "AAAA"}} {
		if got := testutil.ToFloat64(h.srv.metrics.dnsQueries.WithLabelValues(tc.decision, tc.qtype)); got != 0 {
			t.Errorf("dns queries %s %s: %v, want 0", tc.decision, tc.qtype, got)
		}
	}
}

// An answer that does not fit a TCP message even compressed is a SERVFAIL with EDE 23
// (Network Error), counted and logged as denied: the client gets an answer, not
// silence, and not a refusal that would say the policy blocked the name. The upstream's
// own answer fits; the proxy's OPT record, for a client that sent EDNS, makes it
// outgrow 64 KiB.
func TestAnswerTooLargeForTCPIsServfail(t *testing.T) {
	// 12-byte header, 12-byte question, 16 bytes per compressed A record: 65528 bytes.
	upstream := tcpAnswerUpstream(t, func(name string) (rrs []dns.RR) {
		for i := range 4094 {
			rrs = append(rrs, &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(127, 1, byte(i>>8), byte(i))})
		}
		return rrs
	})
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream} })
	h.apply(`"public"`)
	m := new(dns.Msg)
	m.SetQuestion("x.test.", dns.TypeA)
	m.SetEdns0(1232, false)
	resp, _, err := (&dns.Client{Net: "tcp", Timeout: hangGuard}).Exchange(m, h.srv.DNSAddr().String())
	if err != nil {
		t.Fatalf("TCP client got no answer: %v", err)
	}
	if code, ok := ede(resp); resp.Rcode != dns.RcodeServerFailure || !ok || code != dns.ExtendedErrorCodeNetworkError {
		t.Fatalf("rcode %s EDE %d (%v), want SERVFAIL with EDE 23", dns.RcodeToString[resp.Rcode], code, ok)
	}
	// Counted and logged once the answer is written.
	waitFor(t, func() bool { return strings.Contains(h.logs.String(), `"reason":"`+dnsserver.ReasonUpstreamFailed+`"`) })
	waitFor(t, func() bool { return testutil.ToFloat64(h.srv.metrics.dnsQueries.WithLabelValues("denied", "A")) == 1 })
	if got := testutil.ToFloat64(h.srv.metrics.dnsQueries.WithLabelValues("allowed", "A")); got != 0 {
		t.Errorf("counted allowed %v times, want 0", got)
	}
}

// edeText is the text of m's Extended DNS Error, "" without one.
func edeText(m *dns.Msg) string {
	if opt := m.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if e, ok := o.(*dns.EDNS0_EDE); ok {
				return e.ExtraText
			}
		}
	}
	return ""
}

// A refusal says why in its EDE text and is counted under the query's qtype, even for
// a query the server does not serve: a name that reads as an IPv4 address in another
// form is a non-canonical address (a classic bypass), not merely an invalid host.
func TestRefusalReasons(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	for _, tc := range []struct {
		name   string
		qtype  uint16
		qclass uint16
		reason string
	}{
		{"0x7f.0.0.1.", dns.TypeA, dns.ClassINET, ReasonNonCanonicalIP},
		{"2130706433.", dns.TypeAAAA, dns.ClassINET, ReasonNonCanonicalIP},
		{"*.a.test.", dns.TypeA, dns.ClassINET, ReasonInvalidHost},
		{"version.bind.", dns.TypeTXT, dns.ClassCHAOS, dnsserver.ReasonDNSUnsupported},
	} {
		m := new(dns.Msg)
		m.SetQuestion(tc.name, tc.qtype)
		m.Question[0].Qclass = tc.qclass
		m.SetEdns0(1232, false)
		resp, _, err := (&dns.Client{Net: "udp", Timeout: hangGuard}).Exchange(m, h.srv.DNSAddr().String())
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if resp.Rcode != dns.RcodeRefused || !resp.RecursionAvailable || edeText(resp) != "compass-egress: "+tc.reason {
			t.Errorf("%s: %s (RA %v) with EDE text %q, want REFUSED, RA, reason %s", tc.name, dns.RcodeToString[resp.Rcode], resp.RecursionAvailable, edeText(resp), tc.reason)
		}
	}
	// Counted once the answers are written.
	waitFor(t, func() bool {
		return testutil.ToFloat64(h.srv.metrics.dnsQueries.WithLabelValues("denied", "A")) == 2 &&
			testutil.ToFloat64(h.srv.metrics.dnsQueries.WithLabelValues("denied", "AAAA")) == 1 &&
			testutil.ToFloat64(h.srv.metrics.dnsQueries.WithLabelValues("denied", "TXT")) == 1
	})
}

// The answer for a name allowed only through IP/CIDR rules carries records of the asked
// type alone, under the proxy's header (RA set whatever the upstream said), and its
// decision is logged allowed as allowlisted: an address rule allowed it.
func TestAddressRuleAnswerKeepsTheAskedType(t *testing.T) {
	upstream := serveDNSUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.RecursionAvailable = false
		for _, s := range []string{" 60 IN A 10.9.9.9", " 60 IN AAAA fd00::9"} {
			rr, _ := dns.NewRR(r.Question[0].Name + s)
			m.Answer = append(m.Answer, rr)
		}
		_ = w.WriteMsg(m)
	})
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream} })
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["10.9.9.0/24","fd00::/64"]}`)
	resp := h.query("mixed.test", dns.TypeA, "udp")
	if resp.Rcode != dns.RcodeSuccess || !resp.RecursionAvailable || len(resp.Answer) != 1 || resp.Answer[0].Header().Rrtype != dns.TypeA {
		t.Fatalf("answer, want NOERROR, RA, the A record alone:\n%v", resp)
	}
	var lines []map[string]any
	waitFor(t, func() bool { lines = logLines(h.logs.String(), "decision"); return len(lines) == 1 })
	if lines[0]["decision"] != "allowed" || lines[0]["reason"] != string(policy.ReasonAllowlisted) {
		t.Errorf("decision line %v, want allowed, allowlisted", lines[0])
	}
}

// No upstream answering is a SERVFAIL (EDE 23), counted, logged and listed as a denied
// query with reason upstream-failed.
func TestUpstreamFailureIsDenied(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{refusingAddr(t)} })
	h.apply(`"public"`)
	resp := h.query("a.test", dns.TypeA, "udp")
	if code, _ := ede(resp); resp.Rcode != dns.RcodeServerFailure || code != dns.ExtendedErrorCodeNetworkError {
		t.Fatalf("answer %v, want SERVFAIL with EDE 23", resp)
	}
	var lines []map[string]any
	waitFor(t, func() bool { lines = logLines(h.logs.String(), "decision"); return len(lines) == 1 })
	if lines[0]["decision"] != "denied" || lines[0]["reason"] != dnsserver.ReasonUpstreamFailed {
		t.Errorf("decision line %v, want denied, %s", lines[0], dnsserver.ReasonUpstreamFailed)
	}
	if got := testutil.ToFloat64(h.srv.metrics.dnsQueries.WithLabelValues("denied", "A")); got != 1 {
		t.Errorf("counted denied %v times, want 1", got)
	}
}

// The upstream's OPT record never reaches the client: its EDNS options and UDP size
// were meant for the proxy. A client that sent EDNS gets one OPT, the proxy's, with its
// own DO bit back.
func TestUpstreamOPTIsReplaced(t *testing.T) {
	upstream := serveDNSUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A 127.0.0.2")
		m.Answer = []dns.RR{rr}
		m.SetEdns0(1400, true)
		opt := m.IsEdns0()
		opt.Option = append(opt.Option, &dns.EDNS0_LOCAL{Code: 65001, Data: []byte("upstream-secret")})
		_ = w.WriteMsg(m)
	})
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream} })
	h.apply(`"public"`)
	for _, do := range []bool{false, true} {
		m := new(dns.Msg)
		m.SetQuestion("a.test.", dns.TypeA)
		m.SetEdns0(1232, do)
		resp, _, err := (&dns.Client{Net: "udp", Timeout: hangGuard}).Exchange(m, h.srv.DNSAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		opts := 0
		for _, rr := range resp.Extra {
			if rr.Header().Rrtype == dns.TypeOPT {
				opts++
			}
		}
		opt := resp.IsEdns0()
		if opts != 1 || opt == nil || len(opt.Option) != 0 || opt.Do() != do || opt.UDPSize() == 1400 {
			t.Errorf("client DO %v: answer's OPT records %d, first %v; want the proxy's alone, DO %v", do, opts, opt, do)
		}
	}
}

// The answer built for a name allowed only through an address rule has the documented
// bounds: at most 16 addresses, each with TTL 60.
func TestAddressRuleAnswerBounds(t *testing.T) {
	upstream := serveDNSUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		for i := range 20 {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 3600}, A: net.IPv4(10, 9, 9, byte(i))})
		}
		_ = w.WriteMsg(m)
	})
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream} })
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["10.9.9.0/24"]}`)
	resp := h.query("many.test", dns.TypeA, "tcp")
	if len(resp.Answer) != 16 {
		t.Fatalf("%d addresses, want 16", len(resp.Answer))
	}
	for _, rr := range resp.Answer {
		if rr.Header().Ttl != 60 {
			t.Fatalf("TTL %d, want 60: %v", rr.Header().Ttl, rr)
		}
	}
}

// An upstream's UDP answer up to the size the proxy advertises (1232 bytes) is read
// whole over UDP: a smaller read buffer would fail it.
func TestLargeUDPAnswerFromUpstream(t *testing.T) {
	var tcp atomic.Int64
	upstream := serveDNSUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
		if !isUDP(w) {
			tcp.Add(1)
		}
		m := new(dns.Msg)
		m.SetReply(r)
		m.Compress = true
		m.Answer = dnstest.AddrRecords(r.Question[0].Name, 60) // about 1000 bytes compressed
		_ = w.WriteMsg(m)
	})
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream} })
	h.apply(`"public"`)
	resp := h.query("many.test", dns.TypeA, "tcp")
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 60 || tcp.Load() != 0 {
		t.Fatalf("%s with %d of 60 records (%d TCP queries upstream), want NOERROR with 60 over UDP", dns.RcodeToString[resp.Rcode], len(resp.Answer), tcp.Load())
	}
}

// TestDNSAddressRuleAnswerWithNoAddressOfTheAskedTypeIsRefused: a name allowed only
// through an IP/CIDR rule, asked for AAAA, whose upstream answers with an allowed A
// record alone: no address of the asked type remains, so the answer is REFUSED
// (no-allowed-answer), not an empty NOERROR logged as allowed.
func TestDNSAddressRuleAnswerWithNoAddressOfTheAskedTypeIsRefused(t *testing.T) {
	upstream := serveDNSUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A 10.9.9.9")
		m.Answer = append(m.Answer, rr)
		_ = w.WriteMsg(m)
	})
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream} })
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["10.9.9.0/24"]}`)
	resp := h.query("other.test", dns.TypeAAAA, "udp")
	if resp.Rcode != dns.RcodeRefused || edeText(resp) != "compass-egress: "+dnsserver.ReasonNoAllowedAnswer {
		t.Fatalf("answer, want REFUSED no-allowed-answer:\n%v", resp)
	}
}

// TestDNSUnparsableQueryIsCountedAndLogged: a query the DNS library cannot unpack
// (here: an ECS option of an unknown address family) is answered by the library itself,
// before serveDNS, with FORMERR: in no-network too, and nothing goes upstream. It is
// counted as a denied query and logged, where before it left no trace.
func TestDNSUnparsableQueryIsCountedAndLogged(t *testing.T) {
	h := newHarness(t)
	m := new(dns.Msg)
	m.SetQuestion("a.test.", dns.TypeA)
	m.SetEdns0(1232, false)
	m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(1, 2, 3, 0)})
	wire, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	wire[len(wire)-7] = 7 // the ECS family: 7 is none
	c, err := net.Dial("udp", h.srv.DNSAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(wire); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(hangGuard))
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	r := new(dns.Msg)
	if err := r.Unpack(buf[:n]); err != nil {
		t.Fatal(err)
	}
	if r.Rcode != dns.RcodeFormatError || len(r.Answer) != 0 {
		t.Fatalf("answer to an unparsable query: %s with %d records, want FORMERR and none", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	if got := testutil.ToFloat64(h.srv.metrics.dnsQueries.WithLabelValues("denied", "other")); got != 1 {
		t.Errorf("compass_proxy_dns_queries_total{decision=denied,qtype=other} = %v, want 1", got)
	}
	if logs := h.logs.String(); !strings.Contains(logs, `"msg":"dns message malformed"`) || !strings.Contains(logs, `"reason":"malformed-query"`) {
		t.Errorf("no log line for the unparsable query: %s", logs)
	}
}
