package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/policy"
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

// serveDNS answers the sandbox's queries: forward what the policy allows, refuse the
// rest with Extended DNS Error 15 (Blocked).
func (s *Server) serveDNS(w dns.ResponseWriter, req *dns.Msg) {
	// miekg/dns does not recover a handler's panic, which would end the process: the
	// sandbox's DNS and every connection with it. As CoreDNS does, a panic ends this
	// query alone.
	var client string
	wrote := false // a write was attempted: its message may be out, whole or in part
	defer func() {
		if p := recover(); p != nil {
			s.recovered(componentDNS, typeDNS, client, p)
			s.endPanicked(w, req, wrote)
		}
	}()
	client = w.RemoteAddr().String()
	_, udp := w.RemoteAddr().(*net.UDPAddr)
	select {
	case s.dnsSlots <- struct{}{}:
		defer func() { <-s.dnsSlots }()
	default:
		// Full: shed at once rather than pile up goroutines waiting for upstreams.
		// Not logged (a flood would flood the log), counted.
		s.metrics.dnsOverloaded.WithLabelValues(protocolLabel(udp)).Inc()
		wrote = true
		_ = w.WriteMsg(refusal(req, dns.RcodeServerFailure, ReasonOverloaded))
		return
	}
	a := s.answerDNS(s.current.Load(), req)
	resp := a.resp
	// An upstream's answer arrives compressed and unpacks without compression: packed
	// as it came, an answer under 64 KiB could outgrow a TCP message.
	resp.Compress = true
	if udp {
		size := dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = max(int(opt.UDPSize()), dns.MinMsgSize)
		}
		resp.Truncate(size)
	}
	var netErr net.Error
	if err := writeMsg(w, resp, &wrote); err != nil && a.decision == "allowed" && !errors.As(err, &netErr) {
		// Not even compressed does it fit: the client gets SERVFAIL, not silence. (A
		// network error is a TCP client that left: its query was still allowed.)
		s.log.Warn("dns answer not sent", "name", a.name, "error", err.Error())
		a.decision, a.reason = "denied", ReasonUpstreamFailed
		_ = w.WriteMsg(refusal(req, dns.RcodeServerFailure, ReasonUpstreamFailed))
	}
	s.metrics.dnsQueries.WithLabelValues(a.decision, dnsTypeLabel(a.qtype)).Inc()
	if a.decision == "denied" {
		a.rs.blocked.add(a.name, 0, typeDNS, a.reason)
	}
	s.logDecision(a.rs, typeDNS, a.decision, a.reason, a.rule, a.name, 0, netip.Addr{}, client, slog.String("qtype", dns.Type(a.qtype).String()))
}

// writeMsg is w.WriteMsg (the proxy signs nothing: no TSIG) with the packing apart,
// so that wrote says whether a write began: a panic while an upstream's answer is
// packed leaves the query to be answered SERVFAIL.
func writeMsg(w dns.ResponseWriter, m *dns.Msg, wrote *bool) error {
	data, err := m.Pack()
	if err != nil {
		return err
	}
	*wrote = true
	_, err = w.Write(data)
	return err
}

// endPanicked ends a query whose answering panicked: SERVFAIL if nothing was written
// yet; else nothing more, and a TCP connection closes, since a message cut short would
// make the client read the stream's next bytes as an answer. A panic of this last
// write, or of the close, ends the query silently: it is the writer's own.
func (s *Server) endPanicked(w dns.ResponseWriter, req *dns.Msg, wrote bool) {
	defer func() { _ = recover() }()
	if !wrote && req != nil {
		_ = w.WriteMsg(refusal(req, dns.RcodeServerFailure, ReasonInternalError))
		return
	}
	_ = w.Close() // for UDP, nothing: the socket is the server's
}

// acceptDNS hands every message but a response to serveDNS, which refuses what it does
// not serve (no single question, a class other than IN, an opcode other than QUERY)
// with REFUSED and, for an EDNS client, Extended DNS Error 15, as for any refusal. The
// library's default would answer those itself with FORMERR or NOTIMP. A response is
// dropped: answering one could start a loop.
func acceptDNS(h dns.Header) dns.MsgAcceptAction {
	const qr = 1 << 15
	if h.Bits&qr != 0 {
		return dns.MsgIgnore
	}
	return dns.MsgAccept
}

// invalidDNS counts and logs a message the DNS library could not parse. The library
// answers it itself, before serveDNS: FORMERR (RFC 1035's answer to a query the server
// cannot interpret; nothing goes upstream) if its header could be read, else nothing.
// The library does not say who sent it.
func (s *Server) invalidDNS(_ []byte, err error) {
	s.metrics.dnsQueries.WithLabelValues("denied", "other").Inc()
	s.log.Info("dns message malformed", "type", typeDNS, "decision", "denied", "reason", ReasonMalformedQuery, "error", clipError(err))
}

// maxUDPQuery is the longest UDP query read whole: the library's default is 512 bytes,
// which cuts a query with EDNS padding (RFC 8467) or cookies.
const maxUDPQuery = 4096

// dnsAnswer is the outcome of one query, with the rule set that decided it.
type dnsAnswer struct {
	resp                         *dns.Msg
	decision, reason, rule, name string
	qtype                        uint16
	rs                           *RuleSet
}

// dnsRules is what one rule set says about a query's name.
type dnsRules struct {
	decision policy.Decision
	refused  bool
	// keep filters the A/AAAA answers; nil forwards the answer as it is.
	keep func(netip.Addr) bool
}

func decideDNS(m *policy.Matcher, name string, qtype uint16) dnsRules {
	r := dnsRules{decision: m.Decide(name, netip.Addr{}, 0)}
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

// resolvable reports whether the rule set in force lets name be looked up: what the
// sandbox's DNS would forward an A query for.
func (s *Server) resolvable(name string) bool {
	return !decideDNS(s.current.Load().Matcher, name, dns.TypeA).refused
}

// errPolicyChanged stops what a newer rule set refuses: an upstream exchange (or a
// shared lookup) of a name, or a dial whose every address is refused (dialVerdict).
var errPolicyChanged = errors.New("proxy: the policy changed and refuses the name")

func (s *Server) answerDNS(rs *RuleSet, req *dns.Msg) dnsAnswer {
	a := dnsAnswer{rs: rs}
	refuse := func(r string) dnsAnswer {
		a.resp, a.decision, a.reason = refusal(req, dns.RcodeRefused, r), "denied", r
		return a
	}
	if req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 || req.Question[0].Qclass != dns.ClassINET {
		if len(req.Question) > 0 {
			a.qtype = req.Question[0].Qtype
		}
		return refuse(ReasonDNSUnsupported)
	}
	q := req.Question[0]
	a.qtype = q.Qtype
	a.name = strings.ToLower(strings.TrimSuffix(q.Name, "."))
	canonical, err := policy.CanonicalHostname(q.Name)
	if err != nil {
		if policy.IsNonCanonicalIPv4(a.name) {
			return refuse(ReasonNonCanonicalIP)
		}
		return refuse(ReasonInvalidHost)
	}
	a.name = canonical

	rules := decideDNS(rs.Matcher, a.name, a.qtype)
	// redecide follows a swap: the rule set in force now decides, so a query decided
	// under a policy that is gone neither leaves again nor gets its answer.
	redecide := func() bool {
		if cur := s.current.Load(); cur != a.rs {
			a.rs, rules = cur, decideDNS(cur.Matcher, a.name, a.qtype)
		}
		a.rule, a.reason = ruleString(rules.decision.Rule), string(rules.decision.Reason)
		return !rules.refused
	}
	if !redecide() {
		return refuse(a.reason)
	}

	// One --dns-timeout per upstream, and two for a single one (its retry).
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DNSTimeout*time.Duration(max(2, len(s.cfg.DNSUpstreams))))
	defer cancel()
	up, err := s.upstreams.Exchange(ctx, req, func() error {
		if !redecide() {
			return errPolicyChanged
		}
		return nil
	})
	if !redecide() {
		return refuse(a.reason)
	}
	if err != nil {
		s.log.Warn("dns upstream failed", "name", a.name, "error", err.Error())
		a.resp, a.decision, a.reason = refusal(req, dns.RcodeServerFailure, ReasonUpstreamFailed), "denied", ReasonUpstreamFailed
		return a
	}
	if rules.keep != nil {
		before, after := filterAnswers(up, rules.keep)
		if after == 0 && (before > 0 || !rules.decision.Allowed) {
			return refuse(ReasonNoAllowedAnswer)
		}
	}
	if !rules.decision.Allowed {
		a.reason = string(policy.ReasonAllowlisted)
		up = onlyAddresses(up, req)
		if len(up.Answer) == 0 {
			// The allowed addresses were of another type than the asked one.
			return refuse(ReasonNoAllowedAnswer)
		}
	}
	replaceOPT(up, req)
	a.resp, a.decision = up, "allowed"
	return a
}

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
		if a, ok := rrAddr(rr); ok {
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
// which of them come back (at most maxAddressRuleAnswers) still carries some.
func onlyAddresses(m, req *dns.Msg) *dns.Msg {
	q := req.Question[0]
	out := new(dns.Msg)
	out.SetReply(req)
	out.RecursionAvailable = true
	seen := make(map[netip.Addr]bool, len(m.Answer))
	for _, rr := range m.Answer {
		a, ok := rrAddr(rr)
		if !ok || rr.Header().Rrtype != q.Qtype || seen[a] {
			continue
		}
		seen[a] = true
		rr.Header().Name, rr.Header().Ttl = q.Name, addressRuleTTL
		out.Answer = append(out.Answer, rr)
	}
	slices.SortFunc(out.Answer, func(x, y dns.RR) int {
		ax, _ := rrAddr(x)
		ay, _ := rrAddr(y)
		return ax.Compare(ay)
	})
	if len(out.Answer) > maxAddressRuleAnswers {
		out.Answer = out.Answer[:maxAddressRuleAnswers]
	}
	return out
}

// maxAddressRuleAnswers bounds the addresses of an answer onlyAddresses builds; they are
// sorted, so the upstream's order carries nothing either.
const maxAddressRuleAnswers = 16

// addressRuleTTL is the TTL of every record onlyAddresses keeps.
const addressRuleTTL = 60

func protocolLabel(udp bool) string {
	if udp {
		return "udp"
	}
	return "tcp"
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
