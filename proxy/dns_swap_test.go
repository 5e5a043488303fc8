package proxy

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/proxy/dnsserver"
	"github.com/compass-egress/compass-egress/proxy/internal/dnstest"
)

// gateDNS is an upstream that holds every query until the test releases it, then
// answers with rcode (and, for NOERROR, one A record).
type gateDNS struct {
	addr    string
	got     chan string
	release chan struct{}
	rcode   int
	srv     *dns.Server
}

func startGateDNS(t *testing.T, rcode int) *gateDNS {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gateDNS{addr: pc.LocalAddr().String(), got: make(chan string, 16), release: make(chan struct{}), rcode: rcode}
	g.srv = &dns.Server{PacketConn: pc, Net: "udp", Handler: dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		g.got <- req.Question[0].Name
		<-g.release
		m := new(dns.Msg)
		m.SetRcode(req, g.rcode)
		if g.rcode == dns.RcodeSuccess {
			rr, _ := dns.NewRR(req.Question[0].Name + " 60 IN A 192.0.2.1")
			m.Answer = append(m.Answer, rr)
		}
		_ = w.WriteMsg(m)
	})}
	started := make(chan struct{})
	g.srv.NotifyStartedFunc = func() { close(started) }
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = g.srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() {
		select {
		case <-g.release:
		default:
			close(g.release)
		}
		_ = g.srv.Shutdown()
		wg.Wait()
	})
	return g
}

// TestDNSQueryRecheckedAfterSwap: a query decided under public and still waiting for an
// upstream when no-network comes into force is neither sent to the next upstream nor
// answered: the client gets REFUSED.
func TestDNSQueryRecheckedAfterSwap(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rcode int // the held upstream's answer: SERVFAIL makes the proxy try the next one
	}{{"next upstream", dns.RcodeServerFailure}, {"held answer", dns.RcodeSuccess}} {
		t.Run(tc.name, func(t *testing.T) {
			gate := startGateDNS(t, tc.rcode)
			h := newHarness(t, func(c *Config) {
				c.DNSUpstreams = append([]string{gate.addr}, c.DNSUpstreams...)
				c.DNSTimeout = 5 * time.Second
			})
			h.apply(`"public"`)
			answer := h.queryLater(t, "leak-after-swap.a.test")
			<-gate.got
			h.apply(`"no-network"`)
			close(gate.release)
			r := <-answer
			if r == nil || r.Rcode != dns.RcodeRefused {
				t.Fatalf("answer after the swap: %v", r)
			}
			for _, m := range h.dns.seenMsgs() {
				if strings.HasPrefix(m.Question[0].Name, "leak-after-swap") {
					t.Fatalf("the next upstream saw the query after no-network was in force")
				}
			}
		})
	}
}

// TestLookupRecheckedAfterSwap: the proxy's own lookup for a CONNECT decided under an
// allowlist, still waiting for an upstream when no-network comes into force, sends
// nothing more: the next upstream never sees the name, and the client is refused.
func TestLookupRecheckedAfterSwap(t *testing.T) {
	gate := startGateDNS(t, dns.RcodeServerFailure)
	h := newHarness(t, func(c *Config) {
		c.DNSUpstreams = append([]string{gate.addr}, c.DNSUpstreams...)
		c.DNSTimeout = 5 * time.Second
	})
	const name = "lookup-after-swap.test"
	h.dns.set(name, netip.MustParseAddr("127.0.0.2"))
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["` + name + `"]}`)
	type answer struct {
		code   int
		header string
	}
	answered := make(chan answer, 1)
	go func() {
		code, header := h.connectStatus(net.JoinHostPort(name, fmt.Sprint(h.a.echoPort)))
		answered <- answer{code, header}
	}()
	<-gate.got
	h.apply(`"no-network"`)
	close(gate.release)
	if a := <-answered; a.code != http.StatusForbidden || a.header != "denied; reason="+ReasonPolicyChanged {
		t.Fatalf("CONNECT after the swap: status %d %q, want 403 for %s", a.code, a.header, ReasonPolicyChanged)
	}
	waitFor(t, func() bool { return h.srv.ownResolver.Inflight() == 0 })
	for _, m := range h.dns.seenMsgs() {
		if strings.EqualFold(m.Question[0].Name, name+".") {
			t.Fatalf("the next upstream saw %s after no-network was in force", m.Question[0].Name)
		}
	}
}

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

// A query decided under public and held by the upstream while an allowlist with only a
// CIDR rule comes into force gets the rebuilt, address-only answer of the new rule set,
// not the upstream's chatty one.
func TestDNSSwapToAddressRuleMidFlight(t *testing.T) {
	got := make(chan struct{}, 4)
	release := make(chan struct{})
	upstream := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
		got <- struct{}{}
		<-release
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0].Name
		for _, s := range []string{q + " 60 IN CNAME secret.evil.test.", "secret.evil.test. 12345 IN A 10.9.9.9", "secret.evil.test. 60 IN A 192.0.2.1"} {
			rr, _ := dns.NewRR(s)
			m.Answer = append(m.Answer, rr)
		}
		txt, _ := dns.NewRR(`evil.test. 60 IN TXT "secret"`)
		m.Extra = []dns.RR{txt}
		_ = w.WriteMsg(m)
	})
	h := newHarness(t, func(c *Config) { c.DNSUpstreams = []string{upstream}; c.DNSTimeout = 5 * time.Second })
	h.apply(`"public"`)
	answer := h.queryLater(t, "leak.test")
	<-got
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["10.9.9.0/24"]}`)
	close(release)
	r := <-answer
	if r == nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || len(r.Extra) != 0 || r.Answer[0].Header().Name != "leak.test." || r.Answer[0].Header().Ttl != dnsserver.AddressRuleTTL {
		t.Fatalf("answer after the swap:\n%v", r)
	}
}
