package proxy

// Adversarial tests of the DNS server: the header, sections, sizes and kinds of query an
// upstream or a sandbox can choose.

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/proxy/dnsserver"
	"github.com/compass-egress/compass-egress/proxy/dnsupstream"
)

func isUDP(w dns.ResponseWriter) bool { _, ok := w.RemoteAddr().(*net.UDPAddr); return ok }

// tcpAnswerUpstream answers over UDP with TC set and nothing else, so the proxy asks
// again over TCP, and there with answers(the asked name), compressed.
func tcpAnswerUpstream(t *testing.T, answers func(name string) []dns.RR) string {
	return serveDNSUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		if isUDP(w) {
			m.Truncated = true
		} else {
			m.Compress = true
			m.Answer = answers(r.Question[0].Name)
		}
		_ = w.WriteMsg(m)
	})
}

// A name allowed only through an IP/CIDR rule gets its answer under a header of the
// proxy's own: the bits whoever serves the name chose must not reach the sandbox (once
// CD, RD, TC and the opcode did).
func TestDNSAddressRuleAnswerHasTheProxysHeader(t *testing.T) {
	upstream := serveDNSUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
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
	upstream := serveDNSUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
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

// In a denylist, A/AAAA records the IP/CIDR rules deny are removed from every section,
// glue in the authority and additional sections included (once only the answer section
// was filtered).
func TestDNSDenylistFiltersEverySection(t *testing.T) {
	upstream := serveDNSUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		switch q.Qtype {
		case dns.TypeA:
			for _, s := range []string{q.Name + " 60 IN A 127.0.0.2"} {
				rr, _ := dns.NewRR(s)
				m.Answer = append(m.Answer, rr)
			}
			ns, _ := dns.NewRR("ok.test. 60 IN NS ns.ok.test.")
			glue, _ := dns.NewRR("ns.ok.test. 60 IN A 10.1.2.3")
			glue6, _ := dns.NewRR("ns.ok.test. 60 IN AAAA fd00::1")
			// An address record in the authority section, where none belongs.
			nsAddr, _ := dns.NewRR("ns2.ok.test. 60 IN A 10.4.5.6")
			m.Ns = []dns.RR{ns, nsAddr}
			m.Extra = []dns.RR{glue, glue6}
		}
		_ = w.WriteMsg(m)
	})
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream} })
	h.apply(`{"network_mode":"denylist","denied_hosts":["10.0.0.0/8","fd00::/8"]}`)
	resp := h.query("ok.test", dns.TypeA, "udp")
	for _, sec := range [][]dns.RR{resp.Answer, resp.Ns, resp.Extra} {
		for _, rr := range sec {
			if a, ok := dnsupstream.RRAddr(rr); ok && (netip.MustParsePrefix("10.0.0.0/8").Contains(a) || netip.MustParsePrefix("fd00::/8").Contains(a)) {
				t.Errorf("denied address reached the sandbox: %v", rr)
			}
		}
	}
}

// One question per query, class IN, opcode QUERY; anything else is REFUSED with EDE 15
// for an EDNS client, as docs/proxy.md says. miekg/dns's default accept function once
// answered some of these itself: FORMERR for none or two questions, NOTIMP for UPDATE.
// Under public too, where every other query is forwarded.
func TestDNSUnsupportedQueriesAreRefused(t *testing.T) {
	h := newHarness(t)
	cases := map[string]func() *dns.Msg{
		"two questions": func() *dns.Msg {
			m := new(dns.Msg)
			m.SetQuestion("a.test.", dns.TypeA)
			m.Question = append(m.Question, dns.Question{Name: "b.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
			return m
		},
		"no question": func() *dns.Msg {
			m := new(dns.Msg)
			m.Id = dns.Id()
			m.RecursionDesired = true
			return m
		},
		"update": func() *dns.Msg {
			m := new(dns.Msg)
			m.SetUpdate("a.test.")
			return m
		},
		"class CHAOS": func() *dns.Msg {
			m := new(dns.Msg)
			m.SetQuestion("version.bind.", dns.TypeTXT)
			m.Question[0].Qclass = dns.ClassCHAOS
			return m
		},
	}
	for _, pol := range []string{`{"network_mode":"allowlist","allowed_hosts":["a.test","b.test"]}`, `"public"`} {
		h.apply(pol)
		for name, mk := range cases {
			m := mk()
			m.SetEdns0(1232, false)
			resp, _, err := (&dns.Client{Net: "udp", Timeout: hangGuard}).Exchange(m, h.srv.DNSAddr().String())
			if err != nil {
				t.Errorf("%s %s: %v", pol, name, err)
				continue
			}
			code, ok := ede(resp)
			if resp.Rcode != dns.RcodeRefused || !ok || code != dns.ExtendedErrorCodeBlocked {
				t.Errorf("%s %s: rcode %s EDE %d/%v, want REFUSED with EDE 15", pol, name, dns.RcodeToString[resp.Rcode], code, ok)
			}
		}
	}
	for _, m := range h.dns.seenMsgs() {
		if len(m.Question) != 1 || m.Question[0].Qclass != dns.ClassINET {
			t.Errorf("an unsupported query reached the upstream: %v", m.Question)
		}
	}
}

// An upstream's answer must be a response to the question the proxy asked (RFC 5452
// §9.1): one for another name, type or opcode, or with no question, is not relayed under
// the client's question.
func TestDNSAnswerToAnotherQuestionIsNotRelayed(t *testing.T) {
	for name, twist := range map[string]func(*dns.Msg){
		"name":   func(m *dns.Msg) { m.Question[0].Name = "other.test." },
		"type":   func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeAAAA },
		"opcode": func(m *dns.Msg) { m.Opcode = dns.OpcodeStatus },
		"none":   func(m *dns.Msg) { m.Question = nil },
	} {
		t.Run(name, func(t *testing.T) {
			upstream := serveDNSUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
				m := new(dns.Msg)
				m.SetReply(r)
				rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A 127.0.0.9")
				m.Answer = []dns.RR{rr}
				twist(m)
				_ = w.WriteMsg(m)
			})
			h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream} })
			h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
			if resp := h.query("a.test", dns.TypeA, "udp"); resp.Rcode != dns.RcodeServerFailure || len(resp.Answer) > 0 {
				t.Errorf("an answer to another question was relayed:\n%v", resp)
			}
		})
	}
}

// A large answer that the upstream sends compressed over TCP reaches a TCP client whole:
// re-packed without compression it would outgrow 64 KiB, and once the proxy wrote
// nothing at all (the pack failed) and logged the query as allowed.
func TestDNSLargeTCPAnswerIsSent(t *testing.T) {
	long := strings.Repeat("a", 60) + "." + strings.Repeat("b", 60) + "." + strings.Repeat("c", 60) + ".big.test."
	upstream := tcpAnswerUpstream(t, func(string) (rrs []dns.RR) {
		for i := range 3000 {
			rrs = append(rrs, &dns.A{Hdr: dns.RR_Header{Name: long, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(127, 1, byte(i>>8), byte(i))})
		}
		return rrs
	})
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream}; c.DNSTimeout = 2 * time.Second })
	h.apply(`"public"`)
	m := new(dns.Msg)
	m.SetQuestion(long, dns.TypeA)
	resp, _, err := (&dns.Client{Net: "tcp", Timeout: hangGuard}).Exchange(m, h.srv.DNSAddr().String())
	if err != nil {
		t.Fatalf("TCP client got no answer at all: %v", err)
	}
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 3000 {
		t.Fatalf("rcode %s with %d answers, want NOERROR with 3000", dns.RcodeToString[resp.Rcode], len(resp.Answer))
	}
}

// A UDP query longer than 512 bytes (an EDNS padding option, RFC 8467, or a long name
// with a cookie) is read whole: with the library's default 512-byte buffer it was cut
// and answered FORMERR.
func TestDNSUDPQueryOver512Bytes(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	m := new(dns.Msg)
	m.SetQuestion("a.test.", dns.TypeA)
	m.SetEdns0(1232, false)
	opt := m.IsEdns0()
	opt.Option = append(opt.Option, &dns.EDNS0_PADDING{Padding: make([]byte, 600)})
	resp, _, err := (&dns.Client{Net: "udp", Timeout: hangGuard}).Exchange(m, h.srv.DNSAddr().String())
	if err != nil {
		t.Fatalf("no answer to a 600-byte padded UDP query: %v", err)
	}
	if resp.Rcode != dns.RcodeSuccess {
		t.Errorf("rcode %s", dns.RcodeToString[resp.Rcode])
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

// A query decided under public and held by the upstream while an allowlist with only a
// CIDR rule comes into force gets the rebuilt, address-only answer of the new rule set,
// not the upstream's chatty one.
func TestDNSSwapToAddressRuleMidFlight(t *testing.T) {
	got := make(chan struct{}, 4)
	release := make(chan struct{})
	upstream := serveDNSUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
		got <- struct{}{}
		<-release
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0].Name
		for _, s := range []string{q + " 60 IN CNAME secret.evil.test.", "secret.evil.test. 12345 IN A 10.9.9.9", "secret.evil.test. 60 IN A 192.0.2.1"} {
			rr, _ := dns.NewRR(s)
			m.Answer = append(m.Answer, rr)
		}
		txt, _ := dns.NewRR(`evil.test. 60 IN TXT "secret"`)
		m.Extra = []dns.RR{txt}
		_ = w.WriteMsg(m)
	})
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream}; c.DNSTimeout = 5 * time.Second })
	h.apply(`"public"`)
	answer := h.queryLater(t, "leak.test")
	<-got
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["10.9.9.0/24"]}`)
	close(release)
	r := <-answer
	if r == nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || len(r.Extra) != 0 || r.Answer[0].Header().Name != "leak.test." || r.Answer[0].Header().Ttl != dnsserver.AddressRuleTTL {
		t.Fatalf("answer after the swap:\n%v", r)
	}
}

// Mutated queries (byte flips of a valid EDNS query) sent over UDP do not take the DNS
// server down; it still answers afterwards.
func TestDNSMutatedQueriesDoNotStopTheServer(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test","10.0.0.0/8"]}`)
	base := new(dns.Msg)
	base.SetQuestion("a.test.", dns.TypeA)
	base.SetEdns0(1232, true)
	base.IsEdns0().Option = append(base.IsEdns0().Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"})
	wire, err := base.Pack()
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("udp", h.srv.DNSAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	seed := uint32(12345)
	rnd := func() uint32 { seed ^= seed << 13; seed ^= seed >> 17; seed ^= seed << 5; return seed }
	for range 3000 {
		b := append([]byte(nil), wire...)
		for range 1 + rnd()%3 {
			b[rnd()%uint32(len(b))] = byte(rnd())
		}
		if rnd()%4 == 0 {
			b = b[:rnd()%uint32(len(b))]
		}
		_, _ = c.Write(b)
	}
	time.Sleep(200 * time.Millisecond)
	if r := h.query("a.test", dns.TypeA, "udp"); r.Rcode != dns.RcodeSuccess {
		t.Fatalf("after mutated packets: %v", r)
	}
}

// In a denylist, the address hints of HTTPS and SVCB records (RFC 9460 §7.3) lose the
// addresses the IP/CIDR rules deny, as A/AAAA records do: a client may connect to a hint
// before it looks the name up. A hint left empty is dropped, from the record's mandatory
// keys too; the record and its other keys stay.
func TestDNSDenylistFiltersAddressHints(t *testing.T) {
	upstream := serveDNSUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		if q.Qtype == dns.TypeHTTPS {
			for _, s := range []string{
				q.Name + " 60 IN HTTPS 1 . alpn=h2 ipv4hint=127.0.0.2,10.1.2.3 ipv6hint=fd00::1",
				q.Name + " 60 IN HTTPS 2 . mandatory=ipv6hint ipv6hint=fd00::2",
			} {
				rr, err := dns.NewRR(s)
				if err != nil {
					t.Error(err)
					return
				}
				m.Answer = append(m.Answer, rr)
			}
			extra, _ := dns.NewRR("svc.ok.test. 60 IN SVCB 1 . ipv4hint=10.9.9.9,127.0.0.3")
			m.Extra = []dns.RR{extra}
		}
		_ = w.WriteMsg(m)
	})
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream} })
	h.apply(`{"network_mode":"denylist","denied_hosts":["10.0.0.0/8","fd00::/8"]}`)
	resp := h.query("ok.test", dns.TypeHTTPS, "udp")
	var got []string
	for _, sec := range [][]dns.RR{resp.Answer, resp.Extra} {
		for _, rr := range sec {
			if rr.Header().Rrtype != dns.TypeOPT {
				got = append(got, strings.TrimPrefix(rr.String(), rr.Header().String()))
			}
		}
	}
	want := []string{
		`1 . alpn="h2" ipv4hint="127.0.0.2"`,
		`2 .`,
		`1 . ipv4hint="127.0.0.3"`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("records\n%q\nwant\n%q", got, want)
	}
}
