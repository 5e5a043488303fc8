package proxy

import (
	"net/netip"
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/compass-egress/compass-egress/proxy/dnsserver"
	"github.com/compass-egress/compass-egress/proxy/dnsupstream"
	"github.com/compass-egress/compass-egress/proxy/internal/dnstest"
)

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
	upstream := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
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
			upstream := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
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
