package dnsserver

import (
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the server's Prometheus series; the sidecar registers them with its own.
type Metrics struct {
	// Queries counts the queries answered, by decision and query type.
	Queries *prometheus.CounterVec
	// Overloaded counts the queries shed at once because MaxInflight were being answered.
	Overloaded *prometheus.CounterVec
}

// NewMetrics defines the series, every protocol of Overloaded at zero.
func NewMetrics() Metrics {
	m := Metrics{
		Queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_proxy_dns_queries_total",
			Help: "DNS queries answered by the sandbox resolver, by decision and query type (common types by name, others as \"other\").",
		}, []string{"decision", "qtype"}),
		Overloaded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_proxy_dns_overloaded_total",
			Help: "DNS queries answered SERVFAIL at once because --dns-max-inflight queries were being answered, by protocol (udp or tcp).",
		}, []string{"protocol"}),
	}
	for _, p := range []string{"udp", "tcp"} {
		m.Overloaded.WithLabelValues(p)
	}
	return m
}

// typeLabel keeps the qtype label bounded.
func typeLabel(qtype uint16) string {
	switch qtype {
	case dns.TypeA, dns.TypeAAAA, dns.TypeCNAME, dns.TypeMX, dns.TypeTXT, dns.TypeNS,
		dns.TypeSOA, dns.TypePTR, dns.TypeSRV, dns.TypeHTTPS, dns.TypeSVCB, dns.TypeCAA, dns.TypeANY:
		return dns.TypeToString[qtype]
	}
	return "other"
}

func protocolLabel(udp bool) string {
	if udp {
		return "udp"
	}
	return "tcp"
}
