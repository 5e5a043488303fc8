package proxy

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// lossyUDP is a one-upstream resolver whose first datagram for each question is lost:
// it answers every later one (lossy.test has 127.0.0.2, and no IPv6 address).
func lossyUDP(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[dns.Question]bool{}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		q := req.Question[0]
		mu.Lock()
		first := !seen[q]
		seen[q] = true
		mu.Unlock()
		if first {
			return
		}
		m := new(dns.Msg)
		m.SetReply(req)
		if q.Qtype == dns.TypeA && strings.EqualFold(q.Name, "lossy.test.") {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
				A: net.IPv4(127, 0, 0, 2)})
		}
		_ = w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { _ = srv.Shutdown(); <-done })
	return pc.LocalAddr().String()
}

// Upstreams.Exchange asks a silent upstream once more, so that "one lost datagram
// should not fail a decision". The sandbox's DNS gets that retry (its budget is two
// timeouts for a single upstream); a CONNECT's or an HTTP request's decision must too.
func TestDecisionSurvivesOneLostDatagram(t *testing.T) {
	for _, tc := range []struct {
		name string
		try  func(h *harness) (int, string)
	}{
		{"CONNECT", func(h *harness) (int, string) { return h.connectStatus(h.a.echoHostPort("lossy.test")) }},
		{"DNS", func(h *harness) (int, string) {
			r := h.query("lossy.test", dns.TypeA, "udp")
			if r.Rcode == dns.RcodeSuccess && len(r.Answer) == 1 {
				return 200, ""
			}
			return 0, dns.RcodeToString[r.Rcode]
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lossy := lossyUDP(t)
			h := newHarness(t, func(c *Config) {
				c.DNSUpstreams = []string{lossy}
				c.DNSTimeout = 300 * time.Millisecond
			})
			h.apply(`{"network_mode":"allowlist","allowed_hosts":["lossy.test"]}`)
			if status, why := tc.try(h); status != 200 {
				t.Fatalf("%s of lossy.test after one lost datagram: %d %q, want 200", tc.name, status, why)
			}
		})
	}
}
