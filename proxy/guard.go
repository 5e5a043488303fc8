package proxy

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/compass-egress/compass-egress/policy"
)

// privateClasses are the private-use ranges, refused only when the operator asks for it
// (--deny-private): the sidecar's egress network may be a private one itself, and a
// model host on a private address is common. Matched after policy.ClassifyInternal, so
// the cloud endpoints inside fc00::/7 keep their own class.
var privateClasses = []policy.InternalClass{
	{Name: "private", Prefix: netip.MustParsePrefix("10.0.0.0/8"), Liftable: true},
	{Name: "private", Prefix: netip.MustParsePrefix("172.16.0.0/12"), Liftable: true},
	{Name: "private", Prefix: netip.MustParsePrefix("192.168.0.0/16"), Liftable: true},
	{Name: "private", Prefix: netip.MustParsePrefix("100.64.0.0/10"), Liftable: true}, // shared address space (carrier-grade NAT)
	{Name: "private", Prefix: netip.MustParsePrefix("fc00::/7"), Liftable: true},      // unique local
}

// ownClassName names the class of the proxy's own addresses. Only a rule naming the
// one address lifts it (SPEC §7: "unless an IP/CIDR rule explicitly allows that
// address"); a range around it does not, and the proxy's listeners stay refused.
const ownClassName = "proxy-own-address"

// Guard refuses internal addresses: loopback, link-local (cloud metadata included),
// unspecified, multicast, IPv4-embedding IPv6 forms and the proxy's own addresses,
// unless an operator range (--allow-internal) exempts them or a policy rule inside the
// class lifts it (see Refuses). The proxy's own listening endpoints are refused always:
// a tunnel into the proxy is a loop.
type Guard struct {
	allow []netip.Prefix
	// ownAddrs lists the proxy's own addresses. Docker may attach a network after the
	// proxy started, so the set is refreshed when older than ownRefresh.
	ownAddrs func() []netip.Addr
	own      atomic.Pointer[ownSet]
	mu       sync.Mutex
	every    time.Duration
	// listeners are the proxy's bound TCP endpoints (unspecified address: every own one).
	listeners []netip.AddrPort
	// denyPrivate adds privateClasses to the refused ranges.
	denyPrivate bool
}

type ownSet struct {
	addrs map[netip.Addr]struct{}
	at    time.Time
}

const ownRefresh = time.Second

// NewGuard builds a guard with the operator's exempt ranges and a source of the proxy's
// own addresses.
func NewGuard(allowInternal []netip.Prefix, ownAddrs func() []netip.Addr) *Guard {
	g := &Guard{allow: allowInternal, ownAddrs: ownAddrs, every: ownRefresh}
	g.refresh()
	return g
}

// DenyPrivate makes the guard refuse the private-use ranges too (before it is used).
func (g *Guard) DenyPrivate() { g.denyPrivate = true }

// setListeners records the proxy's bound endpoints (before it serves).
func (g *Guard) setListeners(eps []netip.AddrPort) {
	for _, ep := range eps {
		g.listeners = append(g.listeners, netip.AddrPortFrom(ep.Addr().Unmap().WithZone(""), ep.Port()))
	}
}

func (g *Guard) refresh() {
	addrs := g.ownAddrs()
	set := &ownSet{addrs: make(map[netip.Addr]struct{}, len(addrs)), at: time.Now()}
	for _, a := range addrs {
		set.addrs[a.Unmap().WithZone("")] = struct{}{}
	}
	g.own.Store(set)
}

// isOwn reports whether a is one of the proxy's addresses, refreshing a stale set (one
// caller refreshes; the others use the previous set meanwhile).
func (g *Guard) isOwn(a netip.Addr) bool {
	set := g.own.Load()
	if time.Since(set.at) > g.every && g.mu.TryLock() {
		if set = g.own.Load(); time.Since(set.at) > g.every {
			g.refresh()
			set = g.own.Load()
		}
		g.mu.Unlock()
	}
	_, ok := set.addrs[a]
	return ok
}

// classify returns the internal class of a, if any: the fixed classes of
// policy.ClassifyInternal, the proxy's own addresses and, with --deny-private, the
// private ranges. The proxy's own addresses come first: 127.0.0.1 on the proxy's host
// is the proxy, whatever else it is.
func (g *Guard) classify(a netip.Addr) (policy.InternalClass, bool) {
	a = a.WithZone("")
	if g.isOwn(a) {
		return policy.InternalClass{Name: ownClassName, Prefix: netip.PrefixFrom(a, a.BitLen()), Liftable: true}, true
	}
	if c, ok := policy.ClassifyInternal(a); ok {
		return c, true
	}
	if g.denyPrivate {
		for _, c := range privateClasses {
			if c.Prefix.Contains(a) {
				return c, true
			}
		}
	}
	return policy.InternalClass{}, false
}

// Exempt reports whether an --allow-internal range covers addr.
func (g *Guard) Exempt(addr netip.Addr) bool {
	a := addr.WithZone("")
	for _, p := range g.allow {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ownEndpoint reports whether (a, port) reaches one of the proxy's own listeners.
func (g *Guard) ownEndpoint(a netip.Addr, port uint16) bool {
	for _, l := range g.listeners {
		if l.Port() != port {
			continue
		}
		if a == l.Addr() || a.IsUnspecified() || l.Addr().IsUnspecified() && (a.IsLoopback() || g.isOwn(a)) {
			return true
		}
	}
	return false
}

// Refuses reports whether the guard refuses a connection to addr (unmapped by the
// caller) on port under m. The proxy's own listeners are refused always; otherwise an
// --allow-internal range exempts, and an allowlist's IP or CIDR rule lifts a liftable
// class when the rule that allows addr lies within that class.
func (g *Guard) Refuses(m *policy.Matcher, addr netip.Addr, port uint16) bool {
	a := addr.WithZone("")
	if g.ownEndpoint(a, port) {
		return true
	}
	c, internal := g.classify(a)
	if !internal || g.Exempt(a) {
		return false
	}
	return !c.LiftedBy(m, a, port)
}
