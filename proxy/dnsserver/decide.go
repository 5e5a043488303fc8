package dnsserver

import (
	"context"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/proxy/dnsupstream"
)

// DNS reason codes beyond the policy's own.
const (
	ReasonDNSUnsupported  = "unsupported-query" // not a single-question IN query
	ReasonUpstreamFailed  = "upstream-failed"   // no upstream answered
	ReasonNoAllowedAnswer = "no-allowed-answer" // every address in the answer was disallowed
	ReasonOverloaded      = "overloaded"        // --dns-max-inflight queries were being answered
	ReasonInternalError   = "internal-error"    // answering the query panicked
	ReasonMalformedQuery  = "malformed-query"   // the DNS library could not parse the message
)

// Outcome is what became of one query, with the rule set that decided it and its rule
// (Kind zero: none).
type Outcome struct {
	RuleSet                RuleSet
	Decision, Reason, Name string
	Rule                   policy.Target
	Qtype                  uint16
	Client                 string
	resp                   *dns.Msg
}

// rules is what one rule set says about a query's name.
type rules struct {
	decision policy.Decision
	refused  bool
	// keep filters the A/AAAA answers; nil forwards the answer as it is.
	keep func(netip.Addr) bool
}

func decide(m *policy.Matcher, name string, qtype uint16) rules {
	r := rules{decision: m.Decide(name, netip.Addr{}, 0)}
	switch m.Mode() {
	case policy.ModeNoNetwork:
		r.refused = true
	case policy.ModeAllowlist:
		if !r.decision.Allowed {
			if !m.HasAddressRules() || (qtype != dns.TypeA && qtype != dns.TypeAAAA) {
				r.refused = true
				break
			}
			// Allowed only if it resolves into an allowed IP or CIDR rule.
			r.keep = func(a netip.Addr) bool { return m.AllowsAddrExplicitly(a.Unmap(), 0) }
		}
	case policy.ModeDenylist:
		if !r.decision.Allowed {
			r.refused = true
			break
		}
		r.keep = func(a netip.Addr) bool { return m.Decide(name, a.Unmap(), 0).Allowed }
	}
	return r
}

// Resolvable reports whether the rule set in force lets name be looked up: what the
// sandbox's DNS would forward an A query for.
func (s *Server) Resolvable(name string) bool {
	return !decide(s.cfg.Current().PolicyMatcher(), name, dns.TypeA).refused
}

// answer decides req under rs (or the rule set that replaces it meanwhile) and builds
// the answer: a refusal, or the upstream's answer filtered by the rules.
func (s *Server) answer(rs RuleSet, req *dns.Msg) Outcome {
	o := Outcome{RuleSet: rs}
	refuse := func(r string) Outcome {
		o.resp, o.Decision, o.Reason = refusal(req, dns.RcodeRefused, r), "denied", r
		return o
	}
	if req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 || req.Question[0].Qclass != dns.ClassINET {
		if len(req.Question) > 0 {
			o.Qtype = req.Question[0].Qtype
		}
		return refuse(ReasonDNSUnsupported)
	}
	q := req.Question[0]
	o.Qtype = q.Qtype
	if o.Name, o.Reason = queryName(q.Name); o.Reason != "" {
		return refuse(o.Reason)
	}
	r := decide(rs.PolicyMatcher(), o.Name, o.Qtype)
	// redecide follows a swap: the rule set in force now decides, so a query decided
	// under a policy that is gone neither leaves again nor gets its answer.
	redecide := func() bool {
		if cur := s.cfg.Current(); cur != o.RuleSet {
			o.RuleSet, r = cur, decide(cur.PolicyMatcher(), o.Name, o.Qtype)
		}
		o.Rule, o.Reason = r.decision.Rule, string(r.decision.Reason)
		return !r.refused
	}
	if !redecide() {
		return refuse(o.Reason)
	}
	up, err := s.exchange(req, redecide)
	if !redecide() {
		return refuse(o.Reason)
	}
	if err != nil {
		s.cfg.Log.Warn("dns upstream failed", "name", o.Name, "error", err.Error())
		o.resp, o.Decision, o.Reason = refusal(req, dns.RcodeServerFailure, ReasonUpstreamFailed), "denied", ReasonUpstreamFailed
		return o
	}
	up, why := filter(up, req, r)
	if why != "" {
		return refuse(why)
	}
	if !r.decision.Allowed {
		o.Reason = string(policy.ReasonAllowlisted)
	}
	o.resp, o.Decision = up, "allowed"
	return o
}

// queryName is the canonical form of a question's name or, with the reason it has
// none, the name as asked (lower case, no final dot).
func queryName(qname string) (name, reason string) {
	name = strings.ToLower(strings.TrimSuffix(qname, "."))
	canonical, err := policy.CanonicalHostname(qname)
	if err != nil {
		if policy.IsNonCanonicalIPv4(name) {
			return name, string(policy.ReasonNonCanonicalIP)
		}
		return name, string(policy.ReasonInvalidHost)
	}
	return canonical, ""
}

// exchange asks the upstreams, within one --dns-timeout per upstream (two for a single
// one: its retry), asking proceed before every send.
func (s *Server) exchange(req *dns.Msg, proceed func() bool) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout*time.Duration(max(2, s.cfg.UpstreamCount)))
	defer cancel()
	return s.cfg.Upstreams.Exchange(ctx, req, func() error {
		if !proceed() {
			return dnsupstream.ErrPolicyChanged
		}
		return nil
	})
}

// filter applies r to the upstream's answer up: the addresses r keeps and, for a name
// allowed only by its addresses, nothing but them. A non-empty why refuses the query.
func filter(up, req *dns.Msg, r rules) (_ *dns.Msg, why string) {
	if r.keep != nil {
		before, after := filterAnswers(up, r.keep)
		if after == 0 && (before > 0 || !r.decision.Allowed) {
			return nil, ReasonNoAllowedAnswer
		}
	}
	if !r.decision.Allowed {
		up = onlyAddresses(up, req)
		if len(up.Answer) == 0 {
			// The allowed addresses were of another type than the asked one.
			return nil, ReasonNoAllowedAnswer
		}
	}
	replaceOPT(up, req)
	return up, ""
}
