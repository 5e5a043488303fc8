package proxy

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestDNSDecisionLineNamesEveryQtype: a DNS decision line carries the query's type;
// for a type the DNS library has no name for (a private-use type, say) it was empty.
func TestDNSDecisionLineNamesEveryQtype(t *testing.T) {
	h := newHarness(t)
	h.apply(`"no-network"`)
	h.query("private.test", 65280, "udp")
	waitFor(t, func() bool { return strings.Contains(h.logs.String(), `"host":"private.test"`) })
	if logs := h.logs.String(); !strings.Contains(logs, `"qtype":"TYPE65280"`) {
		t.Fatalf("the decision line of a TYPE65280 query: %s", logs)
	}
}

// Every DNS answer is counted under its decision and bounded qtype: a refusal as
// denied, a forwarded answer as allowed.
func TestDNSQueriesCountedByDecision(t *testing.T) {
	h := newHarness(t)
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	if r := h.query("a.test", dns.TypeA, "udp"); r.Rcode != dns.RcodeSuccess {
		t.Fatalf("a.test: %v", r)
	}
	if r := h.query("b.test", dns.TypeAAAA, "udp"); r.Rcode != dns.RcodeRefused {
		t.Fatalf("b.test: %v", r)
	}
	// Counted once the answer is written: wait for both.
	for _, tc := range []struct{ decision, qtype string }{{"allowed", "A"}, {"denied", "AAAA"}} {
		waitFor(t, func() bool {
			return testutil.ToFloat64(h.srv.metrics.dnsQueries.WithLabelValues(tc.decision, tc.qtype)) == 1
		})
	}
	for _, tc := range []struct{ decision, qtype string }{{"denied", "A"}, {"allowed", "AAAA"}} {
		if got := testutil.ToFloat64(h.srv.metrics.dnsQueries.WithLabelValues(tc.decision, tc.qtype)); got != 0 {
			t.Errorf("dns queries %s %s: %v, want 0", tc.decision, tc.qtype, got)
		}
	}
}

// TestDNSUnparsableQueryIsCountedAndLogged: a query the DNS library cannot unpack
// (here: an ECS option of an unknown address family) is answered by the library itself,
// before ServeDNS, with FORMERR: in no-network too, and nothing goes upstream. It is
// counted as a denied query and logged, where before it left no trace.
func TestDNSUnparsableQueryIsCountedAndLogged(t *testing.T) {
	h := newHarness(t)
	m := new(dns.Msg)
	m.SetQuestion("a.test.", dns.TypeA)
	m.SetEdns0(1232, false)
	m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(1, 2, 3, 0)})
	wire, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	wire[len(wire)-7] = 7 // the ECS family: 7 is none
	c, err := net.Dial("udp", h.srv.DNSAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(wire); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(hangGuard))
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	r := new(dns.Msg)
	if err := r.Unpack(buf[:n]); err != nil {
		t.Fatal(err)
	}
	if r.Rcode != dns.RcodeFormatError || len(r.Answer) != 0 {
		t.Fatalf("answer to an unparsable query: %s with %d records, want FORMERR and none", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	if got := testutil.ToFloat64(h.srv.metrics.dnsQueries.WithLabelValues("denied", "other")); got != 1 {
		t.Errorf("compass_proxy_dns_queries_total{decision=denied,qtype=other} = %v, want 1", got)
	}
	if logs := h.logs.String(); !strings.Contains(logs, `"msg":"dns message malformed"`) || !strings.Contains(logs, `"reason":"malformed-query"`) {
		t.Errorf("no log line for the unparsable query: %s", logs)
	}
}
