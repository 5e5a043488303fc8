package proxy

// Queries that carry data out in their name (DNS tunnels
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
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/compass-egress/compass-egress/proxy/dnsserver"
)

// Every type a tunnel or an address hint could use, over UDP and TCP with EDNS options,
// under no-network, an allowlist (also one with an address rule, whose A/AAAA lookups
// are the documented exception) and a denylist; then the other classes and opcodes.
func TestDNSRefusedQueriesNeverLeave(t *testing.T) {
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

// TestDNSRefusedNamesAreNotForwarded: a query the policy refuses never reaches an
// upstream resolver (its name would carry data out): only a name an IP or CIDR rule
// could allow is looked up, and only for A and AAAA.
func TestDNSRefusedNamesAreNotForwarded(t *testing.T) {
	h := newHarness(t)
	cases := []struct {
		policy string
		name   string
		qtype  uint16
	}{
		{`"no-network"`, "c2VjcmV0.exfil.test", dns.TypeA},
		{`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, "c2VjcmV0.exfil.test", dns.TypeA},
		{`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, "c2VjcmV0.exfil.test", dns.TypeAAAA},
		{`{"network_mode":"allowlist","allowed_hosts":["127.0.0.3"]}`, "c2VjcmV0.exfil.test", dns.TypeTXT},
		{`{"network_mode":"allowlist","allowed_hosts":["127.0.0.3"]}`, "c2VjcmV0.exfil.test", dns.TypeMX},
		{`{"network_mode":"denylist","denied_hosts":["exfil.test"]}`, "exfil.test", dns.TypeA},
		{`{"network_mode":"denylist","denied_hosts":["*.exfil.test"]}`, "c2VjcmV0.exfil.test", dns.TypeA},
		// One wire label holding a dot: a name of the zone test, not under exfil.test,
		// though its text unescaped would read as one the wildcard allows.
		{`{"network_mode":"allowlist","allowed_hosts":["*.exfil.test"]}`, `c2VjcmV0\.exfil.test`, dns.TypeA},
		{`{"network_mode":"allowlist","allowed_hosts":["*.exfil.test"]}`, `x\000.exfil.test`, dns.TypeA},
	}
	for _, tc := range cases {
		t.Run(tc.policy+" "+dns.TypeToString[tc.qtype], func(t *testing.T) {
			h.apply(tc.policy)
			if resp := h.query(tc.name, tc.qtype, "udp"); resp.Rcode != dns.RcodeRefused {
				t.Errorf("rcode %s, want REFUSED", dns.RcodeToString[resp.Rcode])
			}
		})
	}
	for _, m := range h.dns.seenMsgs() {
		if strings.HasSuffix(strings.ToLower(m.Question[0].Name), "exfil.test.") {
			t.Errorf("a refused query reached the upstream: %s", m.Question[0].String())
		}
	}
}

// A refusal says why in its EDE text and is counted under the query's qtype, even for
// a query the server does not serve: a name that reads as an IPv4 address in another
// form is a non-canonical address (a classic bypass), not merely an invalid host.
func TestRefusalReasons(t *testing.T) {
	h := newHarness(t)
	h.apply(`"public"`)
	for _, tc := range []struct {
		name   string
		qtype  uint16
		qclass uint16
		reason string
	}{
		{"0x7f.0.0.1.", dns.TypeA, dns.ClassINET, ReasonNonCanonicalIP},
		{"2130706433.", dns.TypeAAAA, dns.ClassINET, ReasonNonCanonicalIP},
		{"*.a.test.", dns.TypeA, dns.ClassINET, ReasonInvalidHost},
		{"version.bind.", dns.TypeTXT, dns.ClassCHAOS, dnsserver.ReasonDNSUnsupported},
	} {
		m := new(dns.Msg)
		m.SetQuestion(tc.name, tc.qtype)
		m.Question[0].Qclass = tc.qclass
		m.SetEdns0(1232, false)
		resp, _, err := (&dns.Client{Net: "udp", Timeout: hangGuard}).Exchange(m, h.srv.DNSAddr().String())
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if resp.Rcode != dns.RcodeRefused || !resp.RecursionAvailable || edeText(resp) != "compass-egress: "+tc.reason {
			t.Errorf("%s: %s (RA %v) with EDE text %q, want REFUSED, RA, reason %s", tc.name, dns.RcodeToString[resp.Rcode], resp.RecursionAvailable, edeText(resp), tc.reason)
		}
	}
	// Counted once the answers are written.
	waitFor(t, func() bool {
		return testutil.ToFloat64(h.srv.metrics.dnsQueries.WithLabelValues("denied", "A")) == 2 &&
			testutil.ToFloat64(h.srv.metrics.dnsQueries.WithLabelValues("denied", "AAAA")) == 1 &&
			testutil.ToFloat64(h.srv.metrics.dnsQueries.WithLabelValues("denied", "TXT")) == 1
	})
}

// edeText is the text of m's Extended DNS Error, "" without one.
func edeText(m *dns.Msg) string {
	if opt := m.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if e, ok := o.(*dns.EDNS0_EDE); ok {
				return e.ExtraText
			}
		}
	}
	return ""
}

// One question per query, class IN, opcode QUERY; anything else is REFUSED with EDE 15
// for an EDNS client, as docs/proxy.md says. miekg/dns's default accept function once
// answered some of these itself: FORMERR for none or two questions, NOTIMP for UPDATE.
// Under public too, where every other query is forwarded.
func TestDNSUnsupportedQueriesAreRefused(t *testing.T) {
	h := newHarness(t)
	cases := map[string]func() *dns.Msg{
		"two questions": func() *dns.Msg {
			m := new(dns.Msg)
			m.SetQuestion("a.test.", dns.TypeA)
			m.Question = append(m.Question, dns.Question{Name: "b.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
			return m
		},
		"no question": func() *dns.Msg {
			m := new(dns.Msg)
			m.Id = dns.Id()
			m.RecursionDesired = true
			return m
		},
		"update": func() *dns.Msg {
			m := new(dns.Msg)
			m.SetUpdate("a.test.")
			return m
		},
		"class CHAOS": func() *dns.Msg {
			m := new(dns.Msg)
			m.SetQuestion("version.bind.", dns.TypeTXT)
			m.Question[0].Qclass = dns.ClassCHAOS
			return m
		},
	}
	for _, pol := range []string{`{"network_mode":"allowlist","allowed_hosts":["a.test","b.test"]}`, `"public"`} {
		h.apply(pol)
		for name, mk := range cases {
			m := mk()
			m.SetEdns0(1232, false)
			resp, _, err := (&dns.Client{Net: "udp", Timeout: hangGuard}).Exchange(m, h.srv.DNSAddr().String())
			if err != nil {
				t.Errorf("%s %s: %v", pol, name, err)
				continue
			}
			code, ok := ede(resp)
			if resp.Rcode != dns.RcodeRefused || !ok || code != dns.ExtendedErrorCodeBlocked {
				t.Errorf("%s %s: rcode %s EDE %d/%v, want REFUSED with EDE 15", pol, name, dns.RcodeToString[resp.Rcode], code, ok)
			}
		}
	}
	for _, m := range h.dns.seenMsgs() {
		if len(m.Question) != 1 || m.Question[0].Qclass != dns.ClassINET {
			t.Errorf("an unsupported query reached the upstream: %v", m.Question)
		}
	}
}
