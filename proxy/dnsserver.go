package proxy

import (
	"context"
	"net"
	"net/netip"
	"strings"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/policy"
)

// DNS reason codes beyond the policy's own.
const (
	ReasonDNSUnsupported  = "unsupported-query" // not a single-question IN query
	ReasonUpstreamFailed  = "upstream-failed"   // no upstream answered
	ReasonNoAllowedAnswer = "no-allowed-answer" // every address in the answer was disallowed
)

// serveDNS answers the sandbox's queries: forward what the policy allows, refuse the
// rest with Extended DNS Error 15 (Blocked).
func (s *Server) serveDNS(w dns.ResponseWriter, req *dns.Msg) {
	client := w.RemoteAddr().String()
	_, udp := w.RemoteAddr().(*net.UDPAddr)
	rs := s.current.Load()
	resp, decision, reason, rule, name, qtype := s.answerDNS(rs, req)
	if udp {
		size := dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = max(int(opt.UDPSize()), dns.MinMsgSize)
		}
		resp.Truncate(size)
	}
	s.metrics.dnsQueries.WithLabelValues(decision, dnsTypeLabel(qtype)).Inc()
	if decision == "denied" {
		rs.blocked.add(name, 0, typeDNS, reason)
	}
	_ = w.WriteMsg(resp)
	s.logDecision(rs, typeDNS, decision, reason, rule, name, 0, netip.Addr{}, client, "qtype", dns.TypeToString[qtype])
}

func (s *Server) answerDNS(rs *RuleSet, req *dns.Msg) (resp *dns.Msg, decision, reason, rule, name string, qtype uint16) {
	m := rs.Matcher
	refuse := func(r string) (*dns.Msg, string, string, string, string, uint16) {
		return refusal(req, dns.RcodeRefused, r), "denied", r, rule, name, qtype
	}
	if req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 || req.Question[0].Qclass != dns.ClassINET {
		if len(req.Question) > 0 {
			qtype = req.Question[0].Qtype
		}
		return refuse(ReasonDNSUnsupported)
	}
	q := req.Question[0]
	qtype = q.Qtype
	name = strings.ToLower(strings.TrimSuffix(q.Name, "."))
	canonical, err := policy.CanonicalHostname(q.Name)
	if err != nil {
		if policy.IsNonCanonicalIPv4(name) {
			return refuse(ReasonNonCanonicalIP)
		}
		return refuse(ReasonInvalidHost)
	}
	name = canonical

	// keep filters the A/AAAA answers; nil forwards the answer as it is.
	var keep func(netip.Addr) bool
	d := m.Decide(name, netip.Addr{}, 0)
	rule = ruleString(d.Rule)
	reason = string(d.Reason)
	switch m.Mode() {
	case policy.ModeNoNetwork:
		return refuse(reason)
	case policy.ModeAllowlist:
		if !d.Allowed {
			if !m.HasAddressRules() || (qtype != dns.TypeA && qtype != dns.TypeAAAA) {
				return refuse(reason)
			}
			// Allowed only if it resolves into an allowed IP or CIDR rule.
			keep = func(a netip.Addr) bool { return m.AllowsAddrExplicitly(a.Unmap(), 0) }
		}
	case policy.ModeDenylist:
		if !d.Allowed {
			return refuse(reason)
		}
		keep = func(a netip.Addr) bool { return m.Decide(name, a.Unmap(), 0).Allowed }
	}

	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DNSTimeout*2)
	defer cancel()
	up, err := s.upstreams.Exchange(ctx, req)
	if err != nil {
		s.log.Warn("dns upstream failed", "name", name, "error", err.Error())
		return refusal(req, dns.RcodeServerFailure, ReasonUpstreamFailed), "denied", ReasonUpstreamFailed, rule, name, qtype
	}
	if keep != nil {
		before, after := filterAnswers(up, keep)
		if after == 0 && (before > 0 || !d.Allowed) {
			return refuse(ReasonNoAllowedAnswer)
		}
	}
	if !d.Allowed {
		reason = string(policy.ReasonAllowlisted)
	}
	replaceOPT(up, req)
	return up, "allowed", reason, rule, name, qtype
}

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

// filterAnswers drops the A and AAAA records keep refuses and returns how many address
// records there were before and after.
func filterAnswers(m *dns.Msg, keep func(netip.Addr) bool) (before, after int) {
	kept := m.Answer[:0]
	for _, rr := range m.Answer {
		if a, ok := rrAddr(rr); ok {
			before++
			if !keep(a) {
				continue
			}
			after++
		}
		kept = append(kept, rr)
	}
	m.Answer = kept
	return before, after
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
