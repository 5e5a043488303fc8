package proxy

// Malformed answers from an upstream. Parsers of DNS
// responses have looped on compression pointers or read past the message (RFC 9267 §2;
// miekg/dns issue 834 on the library's pointer limit; DNSpooq,
// CVE-2020-25681..25683, https://kb.cert.org/vuls/id/434904, for crafted replies).
// miekg/dns returns the part of a message it could read together with the error: that
// part must not reach the sandbox as if it were the answer.

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/proxy/internal/dnstest"
)

// malformedReply packs a valid reply to r (one A record 127.0.0.9 of the asked name,
// no compression, no OPT) and hands its wire form and the offset of the answer record
// to mangle.
func malformedReply(r *dns.Msg, mangle func(wire []byte, answer int) []byte) []byte {
	m := new(dns.Msg)
	m.SetReply(r)
	q := r.Question[0]
	m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: []byte{127, 0, 0, 9}}}
	wire, err := m.Pack()
	if err != nil {
		panic(err)
	}
	// Header, question (name, type, class), answer (name, type, class, TTL, RDLENGTH,
	// 4 bytes of RDATA): the name is written twice, uncompressed.
	nameLen := (len(wire) - 12 - 4 - 14) / 2
	return mangle(wire, 12+nameLen+4)
}

// A malformed upstream answer is a failure of that upstream: the client gets SERVFAIL,
// not the records read before the error, and the server goes on answering.
func TestDNSMalformedUpstreamAnswerIsNotRelayed(t *testing.T) {
	cases := map[string]func(wire []byte, answer int) []byte{
		// The answer's owner name is a pointer to itself.
		"compression pointer loop": func(w []byte, an int) []byte {
			return append(append(w[:an:an], 0xC0|byte(an>>8), byte(an)), w[len(w)-14:]...)
		},
		// A pointer past the end of the message.
		"pointer past the end": func(w []byte, an int) []byte {
			return append(append(w[:an:an], 0xFF, 0xFF), w[len(w)-14:]...)
		},
		// RDLENGTH says 200 bytes; 4 follow.
		"rdata past the end": func(w []byte, _ int) []byte {
			binary.BigEndian.PutUint16(w[len(w)-6:], 200)
			return w
		},
		// The answer section reads whole; the authority record after it is a label
		// that claims 63 bytes and has 2. The library returns the answer section with
		// the error.
		"authority record cut short": func(w []byte, _ int) []byte {
			binary.BigEndian.PutUint16(w[8:], 1)
			return append(w, 63, 'a', 'b')
		},
		// A label length byte with the reserved 01 prefix (RFC 6891 §5: extended
		// label types are gone).
		"reserved label type": func(w []byte, an int) []byte {
			w[an] = 0x41
			return w
		},
	}
	for name, mangle := range cases {
		t.Run(name, func(t *testing.T) {
			upstream := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
				if r.Question[0].Name == "good.test." {
					m := new(dns.Msg)
					m.SetReply(r)
					rr, _ := dns.NewRR("good.test. 60 IN A 127.0.0.2")
					m.Answer = []dns.RR{rr}
					_ = w.WriteMsg(m)
					return
				}
				_, _ = w.Write(malformedReply(r, mangle))
			})
			h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream}; c.DNSTimeout = 2 * time.Second })
			h.apply(`"public"`)
			for _, network := range []string{"udp", "tcp"} {
				resp := h.query("bad.test", dns.TypeA, network)
				if resp.Rcode != dns.RcodeServerFailure || len(resp.Answer) != 0 {
					t.Errorf("%s: a malformed upstream answer reached the client as %s with %d records, want SERVFAIL:\n%v",
						network, dns.RcodeToString[resp.Rcode], len(resp.Answer), resp)
				}
			}
			// The server still answers.
			if resp := h.query("good.test", dns.TypeA, "udp"); resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
				t.Fatalf("after malformed answers: %v", resp)
			}
		})
	}
}
