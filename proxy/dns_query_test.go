package proxy

import (
	"net"
	"testing"

	"github.com/miekg/dns"
)

// TestUpstreamGetsAFreshQuery: only the client's question (and RD, CD, DO) reaches the
// upstream; its other sections, EDNS options (ECS, private codes) and header bits do not,
// and the client gets no upstream OPT back unless it sent EDNS itself.
func TestUpstreamGetsAFreshQuery(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	smuggled, err := dns.NewRR(`smuggled.exfil.test. 60 IN TXT "secret-payload"`)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		edns bool
		do   bool
	}{{"A.Test.", true, true}, {"a.TEST.", true, false}, {"a.test.", false, false}}
	for _, tc := range cases {
		before := len(h.dns.seenMsgs())
		q := new(dns.Msg)
		q.SetQuestion(tc.name, dns.TypeA)
		q.CheckingDisabled = true
		q.AuthenticatedData = true
		q.Ns = append(q.Ns, smuggled)
		q.Answer = append(q.Answer, smuggled)
		if tc.edns {
			q.SetEdns0(4000, tc.do)
			opt := q.IsEdns0()
			opt.Option = append(opt.Option, &dns.EDNS0_LOCAL{Code: 65001, Data: []byte("more-secret")},
				&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 32, Address: net.IPv4(192, 0, 2, 1)})
		}
		resp, _, err := (&dns.Client{Net: "udp", Timeout: hangGuard}).Exchange(q, h.srv.DNSAddr().String())
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 || resp.Question[0].Name != tc.name {
			t.Errorf("%s: answer %v", tc.name, resp)
		}
		if (resp.IsEdns0() != nil) != tc.edns {
			t.Errorf("%s: client EDNS %v, answer OPT %v", tc.name, tc.edns, resp.IsEdns0())
		}
		msgs := h.dns.seenMsgs()[before:]
		if len(msgs) != 1 {
			t.Fatalf("%s: upstream saw %d queries", tc.name, len(msgs))
		}
		up := msgs[0]
		if len(up.Question) != 1 || up.Question[0].Name != "a.test." || len(up.Answer) != 0 || len(up.Ns) != 0 || len(up.Extra) != 1 {
			t.Errorf("%s: upstream got\n%s", tc.name, up)
		}
		if !up.CheckingDisabled || !up.RecursionDesired || up.AuthenticatedData || up.Id == q.Id {
			t.Errorf("%s: upstream header %+v (client ID %d)", tc.name, up.MsgHdr, q.Id)
		}
		opt := up.IsEdns0()
		if opt == nil || len(opt.Option) != 0 || opt.UDPSize() != 1232 || opt.Do() != tc.do {
			t.Errorf("%s: upstream OPT %v", tc.name, opt)
		}
	}
}
