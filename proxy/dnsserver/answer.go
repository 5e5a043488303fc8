package dnsserver

import (
	"net"
	"net/netip"
	"slices"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/proxy/dnsupstream"
)

// filterAnswers drops the A and AAAA records keep refuses, from every section (glue in
// the authority and additional sections names addresses too), and returns how many
// address records the answer section had before and after.
func filterAnswers(m *dns.Msg, keep func(netip.Addr) bool) (before, after int) {
	m.Answer, before, after = filterAddrs(m.Answer, keep)
	m.Ns, _, _ = filterAddrs(m.Ns, keep)
	m.Extra, _, _ = filterAddrs(m.Extra, keep)
	return before, after
}

func filterAddrs(rrs []dns.RR, keep func(netip.Addr) bool) (kept []dns.RR, before, after int) {
	kept = rrs[:0]
	for _, rr := range rrs {
		filterHints(rr, keep)
		if a, ok := dnsupstream.RRAddr(rr); ok {
			before++
			if !keep(a) {
				continue
			}
			after++
		}
		kept = append(kept, rr)
	}
	return kept, before, after
}

// filterHints drops the addresses keep refuses from the ipv4hint and ipv6hint of an
// SVCB or HTTPS record (RFC 9460 §7.3), since a client may connect to a hint before it
// looks the name up. A hint left empty goes, and out of the mandatory keys too (an
// empty hint, or a mandatory key that is absent, makes the whole record malformed).
func filterHints(rr dns.RR, keep func(netip.Addr) bool) {
	var svcb *dns.SVCB
	switch v := rr.(type) {
	case *dns.SVCB:
		svcb = v
	case *dns.HTTPS:
		svcb = &v.SVCB
	default:
		return
	}
	var emptied []dns.SVCBKey
	params := svcb.Value[:0]
	for _, kv := range svcb.Value {
		var hint *[]net.IP
		switch h := kv.(type) {
		case *dns.SVCBIPv4Hint:
			hint = &h.Hint
		case *dns.SVCBIPv6Hint:
			hint = &h.Hint
		}
		if hint != nil {
			*hint = slices.DeleteFunc(*hint, func(ip net.IP) bool {
				a, ok := netip.AddrFromSlice(ip)
				return !ok || !keep(a.Unmap())
			})
			if len(*hint) == 0 {
				emptied = append(emptied, kv.Key())
				continue
			}
		}
		params = append(params, kv)
	}
	svcb.Value = params
	if len(emptied) == 0 {
		return
	}
	svcb.Value = slices.DeleteFunc(svcb.Value, func(kv dns.SVCBKeyValue) bool {
		m, ok := kv.(*dns.SVCBMandatory)
		if !ok {
			return false
		}
		m.Code = slices.DeleteFunc(m.Code, func(k dns.SVCBKey) bool { return slices.Contains(emptied, k) })
		return len(m.Code) == 0
	})
}

// onlyAddresses builds the answer to req, for a name the policy does not allow (one
// that resolves into an allowed IP or CIDR rule), from the addresses of the upstream's
// answer m alone: each address of the asked type once, owned by the asked name, with a
// fixed TTL, under a header of the proxy's own (a reply to req: NOERROR, RA, req's RD
// and CD). Everything else in the upstream's answer (a CNAME chain, authority and
// additional records, TTLs, duplicates, their order, the rcode and header bits) is
// chosen by whoever serves the name and would carry data into the sandbox past the
// policy. The addresses themselves are what the rule allows; inside a wide CIDR rule
// which of them come back (at most MaxAddressRuleAnswers) still carries some.
func onlyAddresses(m, req *dns.Msg) *dns.Msg {
	q := req.Question[0]
	out := new(dns.Msg)
	out.SetReply(req)
	out.RecursionAvailable = true
	seen := make(map[netip.Addr]bool, len(m.Answer))
	for _, rr := range m.Answer {
		a, ok := dnsupstream.RRAddr(rr)
		if !ok || rr.Header().Rrtype != q.Qtype || seen[a] {
			continue
		}
		seen[a] = true
		rr.Header().Name, rr.Header().Ttl = q.Name, AddressRuleTTL
		out.Answer = append(out.Answer, rr)
	}
	slices.SortFunc(out.Answer, func(x, y dns.RR) int {
		ax, _ := dnsupstream.RRAddr(x)
		ay, _ := dnsupstream.RRAddr(y)
		return ax.Compare(ay)
	})
	if len(out.Answer) > MaxAddressRuleAnswers {
		out.Answer = out.Answer[:MaxAddressRuleAnswers]
	}
	return out
}

// MaxAddressRuleAnswers bounds the addresses of an answer onlyAddresses builds; they are
// sorted, so the upstream's order carries nothing either.
const MaxAddressRuleAnswers = 16

// AddressRuleTTL is the TTL of every record onlyAddresses keeps.
const AddressRuleTTL = 60

// replaceOPT swaps the upstream's OPT record for the proxy's own, present only when the
// client sent EDNS (RFC 6891), with the client's DO bit: the upstream's EDNS options
// were meant for the proxy, not for the sandbox.
func replaceOPT(resp, req *dns.Msg) {
	extra := resp.Extra[:0]
	for _, rr := range resp.Extra {
		if rr.Header().Rrtype != dns.TypeOPT {
			extra = append(extra, rr)
		}
	}
	resp.Extra = extra
	if opt := req.IsEdns0(); opt != nil {
		resp.SetEdns0(dns.DefaultMsgSize, opt.Do())
	}
}

// refusal answers with rcode and, for an EDNS client, Extended DNS Error 15 (Blocked).
func refusal(req *dns.Msg, rcode int, why string) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(req, rcode)
	m.RecursionAvailable = true
	if req.IsEdns0() != nil {
		m.SetEdns0(dns.DefaultMsgSize, false)
		code := uint16(dns.ExtendedErrorCodeBlocked)
		if rcode == dns.RcodeServerFailure {
			code = dns.ExtendedErrorCodeNetworkError
		}
		opt := m.IsEdns0()
		opt.Option = append(opt.Option, &dns.EDNS0_EDE{InfoCode: code, ExtraText: "compass-egress: " + why})
	}
	return m
}
