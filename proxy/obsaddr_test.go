package proxy

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// logLines are the JSON lines of msg in logs.
func logLines(logs, msg string) []map[string]any {
	var out []map[string]any
	for _, l := range strings.Split(logs, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// A destination whose first address refuses the connection is reached through its
// second: the decision line's addr is the address dialled, not the first candidate.
func TestDecisionLineNamesTheAddressDialledAfterFailOver(t *testing.T) {
	h := newHarness(t)
	// Nothing listens on 127.0.0.9: its dial is refused at once.
	h.dns.set("fo.test", netip.MustParseAddr("127.0.0.9"), netip.MustParseAddr("127.0.0.2"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["fo.test"]}`)
	if s, hd := h.connectStatus(h.a.echoHostPort("fo.test")); s != 200 {
		t.Fatalf("CONNECT: %d %s", s, hd)
	}
	var closed []map[string]any
	waitFor(t, func() bool { closed = logLines(h.logs.String(), "tunnel closed"); return len(closed) == 1 })
	decisions := logLines(h.logs.String(), "decision")
	if len(decisions) != 1 {
		t.Fatalf("%d decision lines, want 1:\n%s", len(decisions), h.logs.String())
	}
	if got := decisions[0]["addr"]; got != "127.0.0.2" {
		t.Errorf("decision line addr = %v, want the address dialled, 127.0.0.2 (tunnel closed says %v)", got, closed[0]["addr"])
	}
}

// A DNS-over-TCP client that leaves before its allowed answer is sent was counted and
// logged as a denied query (upstream-failed) and listed among the blocked names: the
// failed write was taken for an answer too large for a TCP message.
func TestDNSClientGoneBeforeAnswerIsNotABlockedQuery(t *testing.T) {
	gate := startGateDNS(t, dns.RcodeSuccess)
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{gate.addr} })
	h.apply(`"public"`)
	c, err := net.Dial("tcp", h.srv.DNSAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	q := new(dns.Msg)
	q.SetQuestion("gone.a.test.", dns.TypeA)
	if err := (&dns.Conn{Conn: c}).WriteMsg(q); err != nil {
		t.Fatal(err)
	}
	<-gate.got
	// Reset rather than close: the proxy's write of the answer then fails.
	_ = c.(*net.TCPConn).SetLinger(0)
	c.Close()
	close(gate.release)
	var lines []map[string]any
	waitFor(t, func() bool { lines = logLines(h.logs.String(), "decision"); return len(lines) == 1 })
	if lines[0]["decision"] != "allowed" {
		t.Errorf("decision line %v, want allowed", lines[0])
	}
	if m := h.metricsText(); !strings.Contains(m, `compass_proxy_dns_queries_total{decision="allowed",qtype="A"} 1`) {
		t.Errorf("metrics:\n%s", grepLines(m, "dns_queries_total"))
	}
	if _, body := h.admin("GET", "/v1/blocked", ""); body["total"] != 0.0 {
		t.Errorf("/v1/blocked lists the allowed name: %v", body)
	}
}

// The same for forwarded HTTP requests, whose upstream client (a GET) or net/http's
// Transport (a request with a body) fails over inside the round trip.
func TestHTTPDecisionLineNamesTheAddressDialledAfterFailOver(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		t.Run(method, func(t *testing.T) {
			h := newHarness(t)
			h.dns.set("fo.test", netip.MustParseAddr("127.0.0.9"), netip.MustParseAddr("127.0.0.2"))
			h.apply(`{"network_mode":"allowlist","allowed_hosts":["fo.test"]}`)
			var body io.Reader
			if method == http.MethodPost {
				body = strings.NewReader("x")
			}
			req, err := http.NewRequest(method, "http://"+h.a.httpHostPort("fo.test")+"/", body)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(got), "local=127.0.0.2") {
				t.Fatalf("%s: %d %s", method, resp.StatusCode, got)
			}
			decisions := logLines(h.logs.String(), "decision")
			if len(decisions) != 1 {
				t.Fatalf("%d decision lines, want 1:\n%s", len(decisions), h.logs.String())
			}
			if a := decisions[0]["addr"]; a != "127.0.0.2" {
				t.Errorf("decision line addr = %v, want the address dialled, 127.0.0.2", a)
			}
		})
	}
}
