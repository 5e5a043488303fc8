package proxy

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// silentUDP is an upstream that reads queries and never answers.
func silentUDP(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 4096)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { pc.Close(); wg.Wait() })
	return pc.LocalAddr().String()
}

// TestDNSFailoverPastSilentUpstream: a first upstream that never answers gets its share
// of the budget, not all of it, so the second one answers the client.
func TestDNSFailoverPastSilentUpstream(t *testing.T) {
	silent := silentUDP(t)
	h := newHarness(t, func(c *Config) {
		c.DNSUpstreams = append([]string{silent}, c.DNSUpstreams...)
		c.DNSTimeout = 500 * time.Millisecond
	})
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`)
	if r := h.query("a.test", dns.TypeA, "udp"); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("answer with a silent first upstream: %v", r)
	}
}
