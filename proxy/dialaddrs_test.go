package proxy

import (
	"context"
	"net/netip"
	"testing"
)

// A decision keeps at most 64 checked addresses, the first in the resolver's order:
// whoever serves a name chooses how many addresses it has (thousands in one TCP
// answer), and all of them were kept for the whole request or websocket relay and
// dialled in turn, each with --dial-timeout, holding the client's slot for hours.
func TestDecisionKeepsABoundedAddressList(t *testing.T) {
	const want = 64
	h := newHarness(t)
	addrs := make([]netip.Addr, 300)
	for i := range addrs {
		addrs[i] = netip.AddrFrom4([4]byte{127, 1, byte(i >> 8), byte(i)})
	}
	h.dns.set("many.test", addrs...)
	h.dns.mu.Lock()
	h.dns.truncate["many.test."] = true // over TCP: 300 records do not fit a datagram
	h.dns.mu.Unlock()
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["many.test"]}`)
	v := h.srv.decide(context.Background(), h.srv.current.Load(), "many.test", 443)
	if !v.Allowed || len(v.Addrs) != want {
		t.Fatalf("allowed %v (%s) with %d addresses, want %d", v.Allowed, v.Reason, len(v.Addrs), want)
	}
	for i, a := range v.Addrs {
		if a != addrs[i] {
			t.Fatalf("address %d is %s, want %s (the resolver's order)", i, a, addrs[i])
		}
	}
}

// A lookup that answers no address and no error is a refusal that says so, not one
// without a reason.
func TestDecisionOnAnEmptyAnswer(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Resolver = &rebindingResolver{counts: map[string]int{}} })
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["empty.test"]}`)
	v := h.srv.decide(context.Background(), h.srv.current.Load(), "empty.test", 443)
	if v.Allowed || v.Reason != ReasonResolveFailed {
		t.Fatalf("allowed %v reason %q, want refused with %q", v.Allowed, v.Reason, ReasonResolveFailed)
	}
}
