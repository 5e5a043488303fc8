package proxy

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/proxy/dnsserver"
	"github.com/compass-egress/compass-egress/proxy/dnsupstream"
	"github.com/compass-egress/compass-egress/proxy/internal/dnstest"
)

func TestDNS(t *testing.T) {
	h := newHarness(t)
	h.dns.set("dual.test", netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3"), netip.MustParseAddr("2001:db8::3"))
	cases := []struct {
		policy string
		name   string
		qtype  uint16
		// want is the answer's addresses in order, or nil for REFUSED with EDE 15.
		want []string
	}{
		{`"public"`, "a.test", dns.TypeA, []string{"127.0.0.2"}},
		{`"public"`, "dual.test", dns.TypeAAAA, []string{"2001:db8::3"}},
		{`"no-network"`, "a.test", dns.TypeA, nil},
		{`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, "a.test", dns.TypeA, []string{"127.0.0.2"}},
		{`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, "A.Test", dns.TypeA, []string{"127.0.0.2"}},
		{`{"network_mode":"allowlist","allowed_hosts":["a.test:443"]}`, "a.test", dns.TypeA, []string{"127.0.0.2"}},
		{`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, "b.test", dns.TypeA, nil},
		{`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, "b.test", dns.TypeTXT, nil},
		{`{"network_mode":"allowlist","allowed_hosts":["*.svc.test"]}`, "x.svc.test", dns.TypeA, []string{"127.0.0.4"}},
		{`{"network_mode":"allowlist","allowed_hosts":["*.svc.test"]}`, "svc.test", dns.TypeA, nil},
		// Allowed only through an IP rule: resolves, answers filtered to allowed addresses.
		{`{"network_mode":"allowlist","allowed_hosts":["127.0.0.3"]}`, "dual.test", dns.TypeA, []string{"127.0.0.3"}},
		{`{"network_mode":"allowlist","allowed_hosts":["127.0.0.0/30"]}`, "dual.test", dns.TypeA, []string{"127.0.0.2", "127.0.0.3"}},
		// A query has no port: an address rule with one lets its addresses through.
		{`{"network_mode":"allowlist","allowed_hosts":["127.0.0.3:443"]}`, "dual.test", dns.TypeA, []string{"127.0.0.3"}},
		{`{"network_mode":"allowlist","allowed_hosts":["127.0.0.3"]}`, "a.test", dns.TypeA, nil},
		{`{"network_mode":"allowlist","allowed_hosts":["127.0.0.3"]}`, "dual.test", dns.TypeTXT, nil},
		{`{"network_mode":"allowlist","allowed_hosts":["127.0.0.3"]}`, "missing.test", dns.TypeA, nil},
		{`{"network_mode":"denylist","denied_hosts":["b.test"]}`, "a.test", dns.TypeA, []string{"127.0.0.2"}},
		{`{"network_mode":"denylist","denied_hosts":["b.test"]}`, "b.test.", dns.TypeA, nil},
		{`{"network_mode":"denylist","denied_hosts":["b.test:443"]}`, "b.test", dns.TypeA, []string{"127.0.0.3"}},
		{`{"network_mode":"denylist","denied_hosts":["*.svc.test"]}`, "x.svc.test", dns.TypeA, nil},
		{`{"network_mode":"denylist","denied_hosts":["127.0.0.2"]}`, "dual.test", dns.TypeA, []string{"127.0.0.3"}},
		{`{"network_mode":"denylist","denied_hosts":["127.0.0.2"]}`, "a.test", dns.TypeA, nil},
		{`"public"`, "127.1", dns.TypeA, nil},
	}
	for _, tc := range cases {
		t.Run(tc.policy+" "+tc.name+" "+dns.TypeToString[tc.qtype], func(t *testing.T) {
			h.apply(tc.policy)
			for _, network := range []string{"udp", "tcp"} {
				resp := h.query(tc.name, tc.qtype, network)
				if tc.want == nil {
					code, ok := ede(resp)
					if resp.Rcode != dns.RcodeRefused || !ok || code != dns.ExtendedErrorCodeBlocked {
						t.Fatalf("%s: rcode %s ede %d/%v, want REFUSED with EDE 15", network, dns.RcodeToString[resp.Rcode], code, ok)
					}
					continue
				}
				var got []string
				for _, a := range dnsupstream.AnswerAddrs(resp) {
					got = append(got, a.String())
				}
				if resp.Rcode != dns.RcodeSuccess || strings.Join(got, ",") != strings.Join(tc.want, ",") {
					t.Fatalf("%s: rcode %s answers %v, want %v", network, dns.RcodeToString[resp.Rcode], got, tc.want)
				}
			}
		})
	}
}

// TestDNSRefusedNamesAreNotForwarded: a query the policy refuses never reaches an
// upstream resolver (its name would carry data out): only a name an IP or CIDR rule
// could allow is looked up, and only for A and AAAA.
func TestDNSRefusedNamesAreNotForwarded(t *testing.T) {
	h := newHarness(t)
	cases := []struct {
		policy string
		name   string
		qtype  uint16
	}{
		{`"no-network"`, "c2VjcmV0.exfil.test", dns.TypeA},
		{`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, "c2VjcmV0.exfil.test", dns.TypeA},
		{`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, "c2VjcmV0.exfil.test", dns.TypeAAAA},
		{`{"network_mode":"allowlist","allowed_hosts":["127.0.0.3"]}`, "c2VjcmV0.exfil.test", dns.TypeTXT},
		{`{"network_mode":"allowlist","allowed_hosts":["127.0.0.3"]}`, "c2VjcmV0.exfil.test", dns.TypeMX},
		{`{"network_mode":"denylist","denied_hosts":["exfil.test"]}`, "exfil.test", dns.TypeA},
		{`{"network_mode":"denylist","denied_hosts":["*.exfil.test"]}`, "c2VjcmV0.exfil.test", dns.TypeA},
		// One wire label holding a dot: a name of the zone test, not under exfil.test,
		// though its text unescaped would read as one the wildcard allows.
		{`{"network_mode":"allowlist","allowed_hosts":["*.exfil.test"]}`, `c2VjcmV0\.exfil.test`, dns.TypeA},
		{`{"network_mode":"allowlist","allowed_hosts":["*.exfil.test"]}`, `x\000.exfil.test`, dns.TypeA},
	}
	for _, tc := range cases {
		t.Run(tc.policy+" "+dns.TypeToString[tc.qtype], func(t *testing.T) {
			h.apply(tc.policy)
			if resp := h.query(tc.name, tc.qtype, "udp"); resp.Rcode != dns.RcodeRefused {
				t.Errorf("rcode %s, want REFUSED", dns.RcodeToString[resp.Rcode])
			}
		})
	}
	for _, m := range h.dns.seenMsgs() {
		if strings.HasSuffix(strings.ToLower(m.Question[0].Name), "exfil.test.") {
			t.Errorf("a refused query reached the upstream: %s", m.Question[0].String())
		}
	}
}

func TestDNSUpstreamBehaviour(t *testing.T) {
	// The first upstream refuses everything: the proxy must fail over to the second.
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = append([]string{refusingAddr(t)}, c.DNSUpstreams...) })
	h.apply(`"public"`)

	t.Run("fail-over", func(t *testing.T) {
		resp := h.query("a.test", dns.TypeA, "udp")
		if len(dnsupstream.AnswerAddrs(resp)) != 1 {
			t.Fatalf("answer %v", resp)
		}
	})
	t.Run("truncated answers are retried over TCP", func(t *testing.T) {
		h.dns.set("big.test", netip.MustParseAddr("127.0.0.9"))
		h.dns.mu.Lock()
		h.dns.truncate["big.test."] = true
		h.dns.mu.Unlock()
		resp := h.query("big.test", dns.TypeA, "udp")
		if got := dnsupstream.AnswerAddrs(resp); len(got) != 1 || got[0].String() != "127.0.0.9" {
			t.Fatalf("answer %v", resp)
		}
	})
	t.Run("fresh query IDs", func(t *testing.T) {
		before := len(h.dns.seenIDs())
		for range 3 {
			m := new(dns.Msg)
			m.SetQuestion("a.test.", dns.TypeA)
			m.Id = 4242
			c := &dns.Client{Net: "udp"}
			resp, _, err := c.Exchange(m, h.srv.DNSAddr().String())
			if err != nil || resp.Id != 4242 {
				t.Fatalf("resp %v err %v", resp, err)
			}
		}
		ids := h.dns.seenIDs()[before:]
		same := 0
		for _, id := range ids {
			if id == 4242 {
				same++
			}
		}
		if len(ids) < 3 || same == len(ids) {
			t.Fatalf("upstream saw ids %v: the client's ID leaked through", ids)
		}
	})
	t.Run("not a query", func(t *testing.T) {
		m := new(dns.Msg)
		m.SetNotify("a.test.")
		c := &dns.Client{Net: "udp"}
		resp, _, err := c.Exchange(m, h.srv.DNSAddr().String())
		if err != nil || resp.Rcode != dns.RcodeRefused {
			t.Fatalf("resp %v err %v", resp, err)
		}
	})
}

// refusingAddr is an upstream that answers REFUSED to everything.
func refusingAddr(t *testing.T) string {
	return serveDNSUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeRefused)
		_ = w.WriteMsg(m)
	})
}

// serveDNSUpstream runs handle over UDP and TCP on one loopback port until the test
// ends, and returns its address.
func serveDNSUpstream(t *testing.T, handle dns.HandlerFunc) string { return dnstest.Serve(t, handle) }

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
	return serveDNSUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
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
