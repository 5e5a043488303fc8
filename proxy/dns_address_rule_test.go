package proxy

import (
	"net"
	"net/netip"
	"testing"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/proxy/dnsserver"
	"github.com/compass-egress/compass-egress/proxy/dnsupstream"
	"github.com/compass-egress/compass-egress/proxy/internal/dnstest"
)

// A name the allowlist leaves out but that resolves into an allowed CIDR rule gets its
// addresses only: not the CNAME chain, authority or additional records, TTLs,
// duplicates, rcode or header bits that whoever serves the name chose, all of which
// would carry data into the sandbox.
func TestDNSAddressRuleAnswerCarriesOnlyAddresses(t *testing.T) {
	upstream := chattyUpstream(t)
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream} })
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["10.9.9.0/24"]}`)
	resp := h.query("leak.test", dns.TypeA, "udp")
	if resp.Rcode != dns.RcodeSuccess || resp.Authoritative || resp.Zero || len(resp.Answer) != 1 || len(resp.Ns) != 0 {
		t.Fatalf("answer, want NOERROR, no AA or Z bit, one A record and nothing else:\n%v", resp)
	}
	a, ok := resp.Answer[0].(*dns.A)
	if !ok || a.Hdr.Name != "leak.test." || a.A.String() != "10.9.9.9" || a.Hdr.Ttl != dnsserver.AddressRuleTTL {
		t.Fatalf("answer %v, want leak.test. %d A 10.9.9.9", resp.Answer[0], dnsserver.AddressRuleTTL)
	}
	for _, rr := range resp.Extra {
		if rr.Header().Rrtype != dns.TypeOPT {
			t.Fatalf("additional record %v passed", rr)
		}
	}
}

// chattyUpstream answers every query with data in every part of the answer it can
// choose: an NXDOMAIN rcode and the AA and Z bits over a CNAME to a name, the address
// 10.9.9.9 three times with TTLs that spell text, and authority and additional records.
func chattyUpstream(t *testing.T) string {
	return dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeNameError)
		m.Authoritative, m.Zero = true, true
		q := r.Question[0].Name
		for _, s := range []string{
			q + " 60 IN CNAME secret-in-a-name.evil.test.",
			"secret-in-a-name.evil.test. 1869573999 IN A 10.9.9.9",
			"secret-in-a-name.evil.test. 1702125924 IN A 10.9.9.9",
			"secret-in-a-name.evil.test. 1936287860 IN A 10.9.9.9",
		} {
			rr, _ := dns.NewRR(s)
			m.Answer = append(m.Answer, rr)
		}
		ns, _ := dns.NewRR("evil.test. 60 IN NS secret-in-authority.evil.test.")
		txt, _ := dns.NewRR(`evil.test. 60 IN TXT "secret in additional"`)
		m.Ns, m.Extra = []dns.RR{ns}, []dns.RR{txt}
		_ = w.WriteMsg(m)
	})
}

// A name allowed only through an IP/CIDR rule gets its answer under a header of the
// proxy's own: the bits whoever serves the name chose must not reach the sandbox (once
// CD, RD, TC and the opcode did).
func TestDNSAddressRuleAnswerHasTheProxysHeader(t *testing.T) {
	upstream := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		// Bits an upstream chooses: AA, AD, Z, CD, RD (client asked RD=1), and TC on the
		// TCP answer (over UDP TC would trigger the TCP retry). Another opcode is not an
		// answer at all (TestDNSAnswerToAnotherQuestionIsNotRelayed).
		m.Authoritative, m.AuthenticatedData, m.Zero = true, true, true
		m.CheckingDisabled = true
		m.RecursionDesired = false
		m.Truncated = !isUDP(w)
		rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A 10.9.9.9")
		m.Answer = []dns.RR{rr}
		_ = w.WriteMsg(m)
	})
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream} })
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["10.9.9.0/24"]}`)
	for _, network := range []string{"udp", "tcp"} {
		resp := h.query("leak.test", dns.TypeA, network)
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
			t.Fatalf("%s: answer %v", network, resp)
		}
		if resp.Authoritative || resp.AuthenticatedData || resp.Zero || resp.CheckingDisabled || !resp.RecursionDesired || resp.Truncated || !resp.Response {
			t.Errorf("%s: header chosen by the upstream reached the sandbox:\n%v", network, resp)
		}
	}
}

// The same path over UDP, with an upstream whose UDP and TCP answers are both marked
// truncated: the one-record answer reaches the UDP client without TC (Truncate sets TC
// when it cuts, and never cleared the upstream's).
func TestDNSAddressRuleAnswerDropsTheUpstreamsTC(t *testing.T) {
	upstream := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Truncated = true
		if !isUDP(w) {
			rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A 10.9.9.9")
			m.Answer = []dns.RR{rr}
		}
		_ = w.WriteMsg(m)
	})
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream} })
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["10.9.9.0/24"]}`)
	resp := h.query("leak.test", dns.TypeA, "udp")
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
		t.Fatalf("answer %v", resp)
	}
	if resp.Truncated {
		t.Errorf("a complete 1-record answer reached the UDP client with TC set by the upstream")
	}
}

// The answer for a name allowed only through IP/CIDR rules carries records of the asked
// type alone, under the proxy's header (RA set whatever the upstream said), and its
// decision is logged allowed as allowlisted: an address rule allowed it.
func TestAddressRuleAnswerKeepsTheAskedType(t *testing.T) {
	upstream := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
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

// The answer built for a name allowed only through an address rule has the documented
// bounds: at most 16 addresses, each with TTL 60.
func TestAddressRuleAnswerBounds(t *testing.T) {
	upstream := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
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

// For a name allowed only through a CIDR rule, the upstream chooses which addresses of
// the rule come back: the answer keeps at most dnsserver.MaxAddressRuleAnswers of them, sorted, so
// neither their number nor their order is the upstream's.
func TestDNSAddressRuleAnswerIsBounded(t *testing.T) {
	upstream := tcpAnswerUpstream(t, func(name string) (rrs []dns.RR) {
		for i := range 2000 {
			j := 1999 - i // descending: the order itself is data
			rrs = append(rrs, &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(10, 9, byte(j>>8), byte(j))})
		}
		return rrs
	})
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream} })
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["10.9.0.0/16"]}`)
	resp := h.query("leak.test", dns.TypeA, "tcp")
	t.Logf("rcode %s, %d addresses, first %v", dns.RcodeToString[resp.Rcode], len(resp.Answer), resp.Answer[:min(2, len(resp.Answer))])
	if len(resp.Answer) != dnsserver.MaxAddressRuleAnswers {
		t.Fatalf("%d addresses in one answer to a name allowed by a CIDR rule, want %d", len(resp.Answer), dnsserver.MaxAddressRuleAnswers)
	}
	for i, rr := range resp.Answer {
		if a, _ := dnsupstream.RRAddr(rr); a != netip.AddrFrom4([4]byte{10, 9, 0, byte(i)}) {
			t.Fatalf("address %d is %v: not the sorted lowest", i, rr)
		}
	}
}

// TestDNSAddressRuleAnswerWithNoAddressOfTheAskedTypeIsRefused: a name allowed only
// through an IP/CIDR rule, asked for AAAA, whose upstream answers with an allowed A
// record alone: no address of the asked type remains, so the answer is REFUSED
// (no-allowed-answer), not an empty NOERROR logged as allowed.
func TestDNSAddressRuleAnswerWithNoAddressOfTheAskedTypeIsRefused(t *testing.T) {
	upstream := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
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
