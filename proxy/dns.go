package proxy

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/proxy/blocked"
	"github.com/compass-egress/compass-egress/proxy/dnsserver"
)

// Resolver turns a canonical host name into candidate addresses. The proxy resolves a
// name once per decision and dials only an address it checked.
type Resolver interface {
	LookupNetIP(ctx context.Context, name string) ([]netip.Addr, error)
}

// newDNSServer is the sandbox's DNS server, answering under the rule set in force; its
// decisions are logged and its refusals counted as the proxy's are.
func (s *Server) newDNSServer() *dnsserver.Server {
	return dnsserver.New(dnsserver.Config{
		Upstreams:     s.upstreams,
		UpstreamCount: len(s.cfg.DNSUpstreams),
		Timeout:       s.cfg.DNSTimeout,
		MaxInflight:   s.cfg.DNSMaxInflight,
		Current:       func() dnsserver.RuleSet { return s.current.Load() },
		Decided:       s.dnsDecided,
		Malformed: func(err error) {
			s.log.Info("dns message malformed", "type", typeDNS, "decision", "denied", "reason", dnsserver.ReasonMalformedQuery, "error", clipError(err))
		},
		Recovered: func(client string, p any) { s.recovered(componentDNS, typeDNS, client, p) },
		Answered: func(client netip.Addr, name string, addrs []netip.Addr, ttl time.Duration) {
			s.fqdn.Record(client, name, addrs, ttl)
		},
		Log:     s.log,
		Metrics: dnsserver.Metrics{Queries: s.metrics.dnsQueries, Overloaded: s.metrics.dnsOverloaded},
	})
}

// dnsDecided counts a refused query in the blocked table of the rule set that decided
// it, and writes its decision line.
func (s *Server) dnsDecided(o dnsserver.Outcome) {
	rs := o.RuleSet.(*RuleSet)
	if o.Decision == "denied" {
		rs.blocked.Add(blocked.Key{Host: clipHost(o.Name), Type: typeDNS, Reason: o.Reason})
	}
	s.logDecision(rs, typeDNS, o.Decision, o.Reason, ruleString(o.Rule), o.Name, 0, netip.Addr{}, o.Client, slog.String("qtype", dns.Type(o.Qtype).String()))
}
