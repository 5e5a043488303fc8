package proxy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/proxy/dnsupstream"
	"github.com/compass-egress/compass-egress/proxy/internal/dnstest"
)

// In a denylist, A/AAAA records the IP/CIDR rules deny are removed from every section,
// glue in the authority and additional sections included (once only the answer section
// was filtered).
func TestDNSDenylistFiltersEverySection(t *testing.T) {
	upstream := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
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

// In a denylist, the address hints of HTTPS and SVCB records (RFC 9460 §7.3) lose the
// addresses the IP/CIDR rules deny, as A/AAAA records do: a client may connect to a hint
// before it looks the name up. A hint left empty is dropped, from the record's mandatory
// keys too; the record and its other keys stay.
func TestDNSDenylistFiltersAddressHints(t *testing.T) {
	upstream := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
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
