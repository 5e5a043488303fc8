package proxy

// Forged replies on the proxy's side of the upstream
// exchange. dnsmasq accepted a reply without matching it to the query's ID and
// address/port (DNSpooq, CVE-2020-25684, https://kb.cert.org/vuls/id/434904), and
// miekg/dns once made predictable IDs (CVE-2019-19794, GHSA-44r7-7p62-q3fr): a reply
// that is not the answer to the proxy's own query must be neither relayed to the
// sandbox nor cached for the proxy's own decisions.

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/proxy/dnsupstream"
	"github.com/compass-egress/compass-egress/proxy/internal/dnstest"
)

// forgingUpstream answers every UDP query three times, in this order: from another
// socket with the right ID (an off-path forger that guessed the ID), from its own
// socket with a wrong ID (a reply to some other query), then the real answer: one A
// record 127.0.0.2 for an A query, nothing for others. The forged replies carry A
// records of 10.6.6.6 and 10.6.6.7 whatever the type asked.
func forgingUpstream(t *testing.T) string {
	forger, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { forger.Close() })
	reply := func(r *dns.Msg, addr string) *dns.Msg {
		m := new(dns.Msg)
		m.SetReply(r)
		if addr != "" {
			rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A " + addr)
			m.Answer = []dns.RR{rr}
		}
		return m
	}
	return dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
		if isUDP(w) {
			if b, err := reply(r, "10.6.6.6").Pack(); err == nil {
				_, _ = forger.WriteTo(b, w.RemoteAddr())
			}
			wrong := reply(r, "10.6.6.7")
			wrong.Id ^= 0x5a5a
			if b, err := wrong.Pack(); err == nil {
				_, _ = w.Write(b)
			}
		}
		answer := ""
		if r.Question[0].Qtype == dns.TypeA {
			answer = "127.0.0.2"
		}
		_ = w.WriteMsg(reply(r, answer))
	})
}

// Only the real reply counts, for a sandbox query and for the proxy's own lookup, whose
// answer is then cached.
func TestDNSForgedUpstreamRepliesAreIgnored(t *testing.T) {
	upstream := forgingUpstream(t)
	want := []netip.Addr{netip.MustParseAddr("127.0.0.2")}

	t.Run("sandbox query", func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream}; c.DNSTimeout = 5 * time.Second })
		h.apply(`"public"`)
		resp := h.query("poison.test", dns.TypeA, "udp")
		if got := dnsupstream.AnswerAddrs(resp); resp.Rcode != dns.RcodeSuccess || !slices.Equal(got, want) {
			t.Errorf("answer %v, want only the real reply's %v:\n%v", got, want, resp)
		}
	})

	t.Run("proxy's own lookup and its cache", func(t *testing.T) {
		r := dnsupstream.NewUpstreamResolver(dnsupstream.NewUpstreams([]string{upstream}, 5*time.Second))
		defer r.Close()
		for i := range 2 { // the second answer comes from the cache
			addrs, err := r.LookupNetIP(context.Background(), "poison.test")
			if err != nil || !slices.Equal(addrs, want) {
				t.Fatalf("lookup %d: %v, %v; want only the real reply's %v", i, addrs, err, want)
			}
		}
	})
}
