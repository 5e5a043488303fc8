package proxy

import (
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/compass-egress/compass-egress/proxy/dnsserver"
	"github.com/compass-egress/compass-egress/proxy/internal/dnstest"
)

func isUDP(w dns.ResponseWriter) bool { _, ok := w.RemoteAddr().(*net.UDPAddr); return ok }

// tcpAnswerUpstream answers over UDP with TC set and nothing else, so the proxy asks
// again over TCP, and there with answers(the asked name), compressed.
func tcpAnswerUpstream(t *testing.T, answers func(name string) []dns.RR) string {
	return dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
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

// An upstream's UDP answer up to the size the proxy advertises (1232 bytes) is read
// whole over UDP: a smaller read buffer would fail it.
func TestLargeUDPAnswerFromUpstream(t *testing.T) {
	var tcp atomic.Int64
	upstream := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
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
