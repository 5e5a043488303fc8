package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestDNSInflightBound: with --dns-max-inflight 2 and two queries held by the upstream,
// a third is answered SERVFAIL at once and counted; the held ones still get answers.
func TestDNSInflightBound(t *testing.T) {
	gate := startGateDNS(t, dns.RcodeSuccess)
	h := newHarness(t, func(c *Config) {
		c.DNSUpstreams = []string{gate.addr}
		c.DNSTimeout = 5 * time.Second
		c.DNSMaxInflight = 2
	})
	h.apply(`"public"`)
	answers := make(chan *dns.Msg, 2)
	for _, name := range []string{"one.test.", "two.test."} {
		go func() {
			q := new(dns.Msg)
			q.SetQuestion(name, dns.TypeA)
			r, _, err := (&dns.Client{Timeout: 10 * time.Second}).Exchange(q, h.srv.DNSAddr().String())
			if err != nil {
				t.Error(err)
			}
			answers <- r
		}()
	}
	<-gate.got
	<-gate.got
	if r := h.query("three.test", dns.TypeA, "udp"); r.Rcode != dns.RcodeServerFailure {
		t.Errorf("third query: %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
	close(gate.release)
	for range 2 {
		if r := <-answers; r == nil || r.Rcode != dns.RcodeSuccess {
			t.Errorf("held query: %v", r)
		}
	}
	if m := h.metricsText(); !strings.Contains(m, `compass_proxy_dns_overloaded_total{protocol="udp"} 1`) {
		t.Errorf("overload not counted:\n%s", grepLines(m, "overloaded"))
	}
	// Slots come back: the next query is forwarded.
	if r := h.query("four.test", dns.TypeA, "udp"); r.Rcode != dns.RcodeSuccess {
		t.Errorf("query after the held ones: %s", dns.RcodeToString[r.Rcode])
	}
}

// metricsText scrapes /metrics on the admin socket, where the controller reads it.
func (h *harness) metricsText() string {
	h.t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", h.socket)
		},
	}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://admin/metrics")
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		h.t.Fatalf("GET /metrics on the admin socket: %d %s", resp.StatusCode, body)
	}
	return string(body)
}

func grepLines(text, word string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
