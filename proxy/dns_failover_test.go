package proxy

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/proxy/dnsupstream"
	"github.com/compass-egress/compass-egress/proxy/internal/dnstest"
)

// silentUDP is an upstream that reads queries and never answers.
func silentUDP(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 4096)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { pc.Close(); wg.Wait() })
	return pc.LocalAddr().String()
}

// TestDNSFailoverPastSilentUpstream: a first upstream that never answers gets its share
// of the budget, not all of it, so the second one answers the client.
func TestDNSFailoverPastSilentUpstream(t *testing.T) {
	silent := silentUDP(t)
	h := newHarness(t, func(c *Config) {
		c.DNSUpstreams = append([]string{silent}, c.DNSUpstreams...)
		c.DNSTimeout = 500 * time.Millisecond
	})
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	if r := h.query("a.test", dns.TypeA, "udp"); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("answer with a silent first upstream: %v", r)
	}
}

// TestFailoverPastServerRcodes: an upstream that cannot answer the proxy's query
// (SERVFAIL, REFUSED, FORMERR, NOTIMP) is failed over, for the sandbox's DNS and for the
// proxy's own lookups alike: one broken resolver first in --dns-upstream must neither
// hand its rcode to the sandbox nor fail every connection decision.
func TestFailoverPastServerRcodes(t *testing.T) {
	for _, rcode := range []int{dns.RcodeServerFailure, dns.RcodeRefused, dns.RcodeFormatError, dns.RcodeNotImplemented} {
		t.Run(dns.RcodeToString[rcode], func(t *testing.T) {
			broken := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
				m := new(dns.Msg)
				m.SetRcode(r, rcode)
				_ = w.WriteMsg(m)
			})
			h := newHarness(t, func(c *Config) { c.DNSUpstreams = append([]string{broken}, c.DNSUpstreams...) })
			h.apply(`"public"`)
			if r := h.query("a.test", dns.TypeA, "udp"); r.Rcode != dns.RcodeSuccess || len(dnsupstream.AnswerAddrs(r)) != 1 {
				t.Errorf("sandbox DNS: rcode %s, %d addresses; want the second upstream's answer", dns.RcodeToString[r.Rcode], len(dnsupstream.AnswerAddrs(r)))
			}
			res := dnsupstream.NewUpstreamResolver(dnsupstream.NewUpstreams([]string{broken, h.dns.addr}, time.Second))
			defer res.Close()
			if addrs, err := res.LookupNetIP(context.Background(), "a.test"); err != nil || len(addrs) != 1 {
				t.Errorf("proxy lookup: %v %v; want the second upstream's address", addrs, err)
			}
		})
	}
}
