package dnsserver

import (
	"testing"

	"github.com/miekg/dns"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A message that is itself a response is dropped (answering one could start a loop);
// every query, whatever its opcode, is served, so that ServeDNS refuses what it does not
// serve instead of the library's FORMERR or NOTIMP.
func TestAcceptDNS(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  *dns.Msg
		want dns.MsgAcceptAction
	}{
		{"query", new(dns.Msg).SetQuestion("a.test.", dns.TypeA), dns.MsgAccept},
		{"notify", new(dns.Msg).SetNotify("a.test."), dns.MsgAccept},
		{"update", new(dns.Msg).SetUpdate("test."), dns.MsgAccept},
		{"response", new(dns.Msg).SetReply(new(dns.Msg).SetQuestion("a.test.", dns.TypeA)), dns.MsgIgnore},
	} {
		data, err := tc.msg.Pack()
		if err != nil {
			t.Fatal(err)
		}
		h := dns.Header{Id: uint16(data[0])<<8 | uint16(data[1]), Bits: uint16(data[2])<<8 | uint16(data[3])}
		if got := accept(h); got != tc.want {
			t.Errorf("%s: accept %v, want %v", tc.name, got, tc.want)
		}
	}
}
