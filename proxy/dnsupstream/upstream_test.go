package dnsupstream

import (
	"context"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/compass-egress/compass-egress/proxy/internal/dnstest"
)

// Every query that leaves gets an ID of its own, a fail-over to the next upstream
// included: the same ID twice would let an off-path spoofer who saw one answer the next.
func TestFailoverQueryHasAFreshID(t *testing.T) {
	var mu sync.Mutex
	var ids []uint16
	record := func(id uint16) { mu.Lock(); ids = append(ids, id); mu.Unlock() }
	first := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
		record(r.Id)
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeServerFailure)
		_ = w.WriteMsg(m)
	})
	second := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
		record(r.Id)
		m := new(dns.Msg)
		m.SetReply(r)
		rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A 127.0.0.2")
		m.Answer = []dns.RR{rr}
		_ = w.WriteMsg(m)
	})
	u := NewUpstreams([]string{first, second}, time.Second)
	for range 4 {
		q := new(dns.Msg)
		q.SetQuestion("a.test.", dns.TypeA)
		if _, err := u.Exchange(context.Background(), q, nil); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ids) != 8 {
		t.Fatalf("upstreams saw %d queries, want 8", len(ids))
	}
	// Four tries of one ID each would repeat it; 16-bit random IDs repeat within a pair
	// by chance once in 65536.
	for i := 0; i < len(ids); i += 2 {
		if ids[i] == ids[i+1] {
			t.Fatalf("query %d left with ID %d to both upstreams (IDs %v)", i/2, ids[i], ids)
		}
	}
}

// A cached answer serves lookups until it expires, and not after.
func TestResolverCacheExpires(t *testing.T) {
	var answer atomic.Pointer[string]
	set := func(a string) { answer.Store(&a) }
	set("127.0.0.2")
	addr := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		if r.Question[0].Qtype == dns.TypeA {
			rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A " + *answer.Load())
			m.Answer = []dns.RR{rr}
		}
		_ = w.WriteMsg(m)
	})
	r := NewUpstreamResolver(NewUpstreams([]string{addr}, time.Second))
	defer r.Close()
	lookup := func() netip.Addr {
		t.Helper()
		addrs, err := r.LookupNetIP(context.Background(), "ttl.test")
		if err != nil || len(addrs) != 1 {
			t.Fatalf("lookup: %v, %v", addrs, err)
		}
		return addrs[0]
	}
	lookup()
	set("127.0.0.3")
	if a := lookup(); a != netip.MustParseAddr("127.0.0.2") {
		t.Fatalf("within its TTL the lookup got %s, want the cached 127.0.0.2", a)
	}
	r.mu.Lock()
	c := r.cache["ttl.test"]
	c.expires = time.Now().Add(-time.Second)
	r.cache["ttl.test"] = c
	r.mu.Unlock()
	if a := lookup(); a != netip.MustParseAddr("127.0.0.3") {
		t.Fatalf("after its TTL the lookup got %s, want the new 127.0.0.3", a)
	}
}

// Concurrent lookups of one name share its queries: a burst of decisions costs one
// lookup.
func TestConcurrentLookupsShareOneQuery(t *testing.T) {
	var queries atomic.Int64
	release := make(chan struct{})
	got := make(chan struct{}, 16)
	addr := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
		queries.Add(1)
		got <- struct{}{}
		<-release
		m := new(dns.Msg)
		m.SetReply(r)
		if r.Question[0].Qtype == dns.TypeA {
			rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A 127.0.0.2")
			m.Answer = []dns.RR{rr}
		}
		_ = w.WriteMsg(m)
	})
	r := NewUpstreamResolver(NewUpstreams([]string{addr}, 10*time.Second))
	done := make(chan error, 1)
	go func() { _, err := r.LookupNetIP(context.Background(), "burst.test"); done <- err }()
	<-got
	<-got // the first lookup's A and AAAA queries are out
	// A second lookup joins the first (it gives up at once: its context is cancelled).
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _ = r.LookupNetIP(ctx, "burst.test")
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r.Close() // waits for every lookup the resolver started
	if n := queries.Load(); n != 2 {
		t.Fatalf("two lookups of one name sent %d queries, want 2", n)
	}
}

// The cache keeps answers of up to resolverMaxCachedAddrs addresses, and up to
// resolverCacheSize names: at the bound, a new name takes an old one's place.
func TestResolverCacheBounds(t *testing.T) {
	var queries atomic.Int64
	addr := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
		queries.Add(1)
		m := new(dns.Msg)
		m.SetReply(r)
		m.Compress = true
		if r.Question[0].Name == "wide.test." && r.Question[0].Qtype == dns.TypeA {
			m.Answer = dnstest.AddrRecords(r.Question[0].Name, resolverMaxCachedAddrs)
		} else if r.Question[0].Qtype == dns.TypeA {
			rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A 127.0.0.2")
			m.Answer = []dns.RR{rr}
		}
		_ = w.WriteMsg(m)
	})
	r := NewUpstreamResolver(NewUpstreams([]string{addr}, 10*time.Second))
	defer r.Close()
	for range 2 {
		if addrs, err := r.LookupNetIP(context.Background(), "wide.test"); err != nil || len(addrs) != resolverMaxCachedAddrs {
			t.Fatalf("wide.test: %d addresses, %v", len(addrs), err)
		}
	}
	if n := queries.Load(); n != 2 {
		t.Fatalf("two lookups of an answer of %d addresses sent %d queries, want 2 (cached)", resolverMaxCachedAddrs, n)
	}
	for i := range resolverCacheSize + 2 {
		if _, err := r.LookupNetIP(context.Background(), "n"+strconv.Itoa(i)+".test"); err != nil {
			t.Fatal(err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.cache) != resolverCacheSize {
		t.Fatalf("%d names cached, want %d", len(r.cache), resolverCacheSize)
	}
}

// A message without the QR bit, or with more than the one question asked, is not an
// answer to it (RFC 5452 §9.1), whatever it holds: the next upstream is asked.
func TestMessageThatIsNoResponseIsNotAnAnswer(t *testing.T) {
	answer := func(change func(*dns.Msg), a string) string {
		return dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
			m := new(dns.Msg)
			m.SetReply(r)
			rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A " + a)
			m.Answer = []dns.RR{rr}
			change(m)
			_ = w.WriteMsg(m)
		})
	}
	for _, tc := range []struct {
		name   string
		change func(*dns.Msg)
	}{
		{"no QR bit", func(m *dns.Msg) { m.Response = false }},
		{"two questions", func(m *dns.Msg) {
			m.Question = append(m.Question, dns.Question{Name: "b.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
		}},
	} {
		u := NewUpstreams([]string{answer(tc.change, "10.6.6.6"), answer(func(*dns.Msg) {}, "127.0.0.2")}, time.Second)
		q := new(dns.Msg)
		q.SetQuestion("a.test.", dns.TypeA)
		resp, err := u.Exchange(context.Background(), q, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := AnswerAddrs(resp); len(got) != 1 || got[0] != netip.MustParseAddr("127.0.0.2") {
			t.Fatalf("%s: answer %v, want the second upstream's 127.0.0.2", tc.name, got)
		}
	}
}

// A lookup returns IPv4 first and is cached for the shortest TTL of its records, and
// for at most resolverMaxTTL.
func TestResolverOrderAndTTL(t *testing.T) {
	addr := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		ttls := map[string][2]string{"long.test.": {"86400", "86400"}, "short6.test.": {"300", "10"}}[q.Name]
		switch q.Qtype {
		case dns.TypeA:
			rr, _ := dns.NewRR(q.Name + " " + ttls[0] + " IN A 127.0.0.2")
			m.Answer = []dns.RR{rr}
		case dns.TypeAAAA:
			rr, _ := dns.NewRR(q.Name + " " + ttls[1] + " IN AAAA fd00::2")
			m.Answer = []dns.RR{rr}
		}
		_ = w.WriteMsg(m)
	})
	r := NewUpstreamResolver(NewUpstreams([]string{addr}, 10*time.Second))
	defer r.Close()
	for _, tc := range []struct {
		name string
		ttl  time.Duration
	}{{"long.test", resolverMaxTTL}, {"short6.test", 10 * time.Second}} {
		start := time.Now()
		addrs, err := r.LookupNetIP(context.Background(), tc.name)
		if err != nil || len(addrs) != 2 || !addrs[0].Is4() || !addrs[1].Is6() {
			t.Fatalf("%s: %v, %v; want the IPv4 address, then the IPv6 one", tc.name, addrs, err)
		}
		r.mu.Lock()
		expires := r.cache[tc.name].expires
		r.mu.Unlock()
		if expires.Before(start.Add(tc.ttl)) || expires.After(time.Now().Add(tc.ttl)) {
			t.Errorf("%s: cached for %v, want %v", tc.name, expires.Sub(start), tc.ttl)
		}
	}
}

// The upstream query carries the client's RD bit as it is, and an answer whose question
// differs from the query's in case only (DNS 0x20) is the answer.
func TestQueryRDAndAnswerCase(t *testing.T) {
	var rd atomic.Bool
	addr := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
		rd.Store(r.RecursionDesired)
		m := new(dns.Msg)
		m.SetReply(r)
		m.Question[0].Name = "A.TeSt."
		rr, _ := dns.NewRR("a.test. 60 IN A 127.0.0.2")
		m.Answer = []dns.RR{rr}
		_ = w.WriteMsg(m)
	})
	u := NewUpstreams([]string{addr}, time.Second)
	for _, want := range []bool{false, true} {
		q := new(dns.Msg)
		q.SetQuestion("a.test.", dns.TypeA)
		q.RecursionDesired = want
		resp, err := u.Exchange(context.Background(), q, nil)
		if err != nil {
			t.Fatalf("RD %v: %v", want, err)
		}
		if rd.Load() != want || len(resp.Answer) != 1 {
			t.Fatalf("client RD %v: upstream saw RD %v, answer %v", want, rd.Load(), resp.Answer)
		}
	}
}
