package proxy

import (
	"context"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestFailoverPastServerRcodes: an upstream that cannot answer the proxy's query
// (SERVFAIL, REFUSED, FORMERR, NOTIMP) is failed over, for the sandbox's DNS and for the
// proxy's own lookups alike: one broken resolver first in --dns-upstream must neither
// hand its rcode to the sandbox nor fail every connection decision.
func TestFailoverPastServerRcodes(t *testing.T) {
	for _, rcode := range []int{dns.RcodeServerFailure, dns.RcodeRefused, dns.RcodeFormatError, dns.RcodeNotImplemented} {
		t.Run(dns.RcodeToString[rcode], func(t *testing.T) {
			broken := serveDNSUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
				m := new(dns.Msg)
				m.SetRcode(r, rcode)
				_ = w.WriteMsg(m)
			})
			h := newHarness(t, func(c *Config) { c.DNSUpstreams = append([]string{broken}, c.DNSUpstreams...) })
			h.apply(`"public"`)
			if r := h.query("a.test", dns.TypeA, "udp"); r.Rcode != dns.RcodeSuccess || len(answerAddrs(r)) != 1 {
				t.Errorf("sandbox DNS: rcode %s, %d addresses; want the second upstream's answer", dns.RcodeToString[r.Rcode], len(answerAddrs(r)))
			}
			res := NewUpstreamResolver(NewUpstreams([]string{broken, h.dns.addr}, time.Second))
			defer res.Close()
			if addrs, err := res.LookupNetIP(context.Background(), "a.test"); err != nil || len(addrs) != 1 {
				t.Errorf("proxy lookup: %v %v; want the second upstream's address", addrs, err)
			}
		})
	}
}
