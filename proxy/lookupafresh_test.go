package proxy

import (
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestSwapStartsLookupsAfresh: a lookup sent while the sidecar's way out was cut (its
// upstream silent) must not fail the decisions made after the switch that repaired
// the wiring: they send queries of their own instead of waiting on it.
func TestSwapStartsLookupsAfresh(t *testing.T) {
	const name = "after-repair.test"
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var answering atomic.Bool
	dropped := make(chan struct{}, 16)
	srv := &dns.Server{PacketConn: pc, Net: "udp", Handler: dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		if !answering.Load() {
			dropped <- struct{}{} // the way out is cut: no answer
			return
		}
		m := new(dns.Msg)
		m.SetReply(req)
		if req.Question[0].Qtype == dns.TypeA {
			rr, _ := dns.NewRR(req.Question[0].Name + " 60 IN A 127.0.0.2")
			m.Answer = append(m.Answer, rr)
		}
		_ = w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { _ = srv.Shutdown(); wg.Wait() })

	// The lookup's budget (two tries of DNSTimeout) is far beyond the harness's 10 s
	// CONNECT deadline: a decision that waited on the first lookup fails that deadline.
	h := newHarness(t, func(c *Config) {
		c.DNSUpstreams = []string{pc.LocalAddr().String()}
		c.DNSTimeout = 30 * time.Second
	})
	allow := `{"network_mode":"allowlist","allowed_hosts":["` + name + `"]}`
	h.apply(allow)
	target := net.JoinHostPort(name, fmt.Sprint(h.a.echoPort))

	first, err := net.Dial("tcp", h.srv.ProxyAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if _, err := fmt.Fprintf(first, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target); err != nil {
		t.Fatal(err)
	}
	<-dropped // the first decision's lookup is in flight, unanswered

	answering.Store(true) // the wiring is repaired ...
	h.apply(allow)        // ... and the switch that repaired it puts the rules again
	if code, header := h.connectStatus(target); code != http.StatusOK {
		t.Fatalf("CONNECT after the repairing switch: %d %q, want 200", code, header)
	}
}
