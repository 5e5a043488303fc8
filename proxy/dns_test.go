package proxy

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

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

// refusingAddr is an upstream that answers REFUSED to everything.
func refusingAddr(t *testing.T) string {
	return dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeRefused)
		_ = w.WriteMsg(m)
	})
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
