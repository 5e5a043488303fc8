package dnsupstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"go.uber.org/goleak"

	"github.com/compass-egress/compass-egress/proxy/internal/dnstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hangGuard bounds a test's wait for a lookup to end: reaching it means a hang.
const hangGuard = 30 * time.Second

// TestResolverDoesNotCacheAHalfAnswer: when one of a lookup's two queries fails (its
// upstream answered SERVFAIL, or it was lost) and the other answered, the lookup
// returns what it has, but must not cache it for the TTL: the next decision would get
// only one address family for up to five minutes.
func TestResolverDoesNotCacheAHalfAnswer(t *testing.T) {
	var aQueries atomic.Int32
	addr := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		switch q.Qtype {
		case dns.TypeA:
			if aQueries.Add(1) == 1 { // the first A query fails
				m.Rcode = dns.RcodeServerFailure
				break
			}
			rr, _ := dns.NewRR(q.Name + " 300 IN A 192.0.2.7")
			m.Answer = append(m.Answer, rr)
		case dns.TypeAAAA:
			rr, _ := dns.NewRR(q.Name + " 300 IN AAAA 2001:db8::7")
			m.Answer = append(m.Answer, rr)
		}
		_ = w.WriteMsg(m)
	})
	r := NewUpstreamResolver(NewUpstreams([]string{addr}, time.Second))
	defer r.Close()
	first, err := r.LookupNetIP(context.Background(), "half.test")
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 1 || first[0] != netip.MustParseAddr("2001:db8::7") {
		t.Fatalf("first lookup: %v, want the AAAA answer alone", first)
	}
	second, err := r.LookupNetIP(context.Background(), "half.test")
	if err != nil {
		t.Fatal(err)
	}
	if len(second) != 2 {
		t.Fatalf("second lookup: %v (A queries sent: %d), want both families: the half answer was cached", second, aQueries.Load())
	}
}

// TestResolverMemoryIsBounded: the proxy's cache holds up to resolverCacheSize names
// for up to five minutes, and whoever serves a name the sandbox has it look up (any
// name, under public, a denylist or an allowlist with an address rule) chooses how many
// addresses its answer carries: over TCP, thousands. Kept whole, 4096 such names pin
// hundreds of MiB of the sidecar's memory.
func TestResolverMemoryIsBounded(t *testing.T) {
	const perAnswer, names = 2000, 512
	addr := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
			m.Truncated = true
		} else if q.Qtype == dns.TypeA {
			for i := range perAnswer {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300},
					A: net.IPv4(198, 18, byte(i>>8), byte(i)).To4()})
			}
		}
		m.Compress = true
		_ = w.WriteMsg(m)
	})
	r := NewUpstreamResolver(NewUpstreams([]string{addr}, 2*time.Second))
	defer r.Close()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range names {
		if _, err := r.LookupNetIP(context.Background(), fmt.Sprintf("n%d.big.test", i)); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(r)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	// Scaled to the cache's 4096 names:
	if full := grew * resolverCacheSize / names; full > 32<<20 {
		t.Fatalf("%d cached names of %d addresses each hold %d KiB: a full cache would hold %d MiB", names, perAnswer, grew>>10, full>>20)
	}
}

// TestResolverRecoversPanic: a panic in the proxy's own lookup of a name (in the
// lookup, or in one of its two queries) fails that lookup and is counted; a later
// lookup of the name does not wait on the one that panicked.
func TestResolverRecoversPanic(t *testing.T) {
	fake := dnstest.Serve(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		_ = w.WriteMsg(m)
	})
	for _, tc := range []struct {
		name     string
		resolver func() *UpstreamResolver
	}{
		{name: "the lookup", resolver: func() *UpstreamResolver { return NewUpstreamResolver(nil) }},
		{name: "a query", resolver: func() *UpstreamResolver {
			r := NewUpstreamResolver(NewUpstreams([]string{fake}, time.Second))
			r.Admit = func(string) bool { panic("test: admit panics") }
			return r
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.resolver()
			var mu sync.Mutex
			var panics []any
			r.Panicked = func(p any) { mu.Lock(); panics = append(panics, p); mu.Unlock() }
			for i := range 2 {
				ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
				_, err := r.LookupNetIP(ctx, "a.test")
				cancel()
				if !errors.Is(err, ErrLookupPanicked) {
					t.Errorf("lookup %d: %v, want %v", i, err, ErrLookupPanicked)
				}
			}
			r.Close()
			mu.Lock()
			defer mu.Unlock()
			if len(panics) < 2 {
				t.Errorf("panics seen: %v, want one per lookup at least", panics)
			}
		})
	}
}
