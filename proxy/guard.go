package proxy

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/compass-egress/compass-egress/policy"
)

// internalClass is one range the guard refuses by default. An allowlist's IP or CIDR
// rule lifts the guard only for a liftable class and only when the rule lies inside the
// class's prefix: "127.0.0.0/8" opens loopback, "0.0.0.0/0" opens nothing internal.
type internalClass struct {
	name     string
	prefix   netip.Prefix
	liftable bool
}

// internalClasses in match order: specific ranges before the ranges that contain them
// (::1 and :: lie inside ::/96).
var internalClasses = []internalClass{
	{"loopback", netip.MustParsePrefix("127.0.0.0/8"), true},
	{"loopback", netip.MustParsePrefix("::1/128"), true},
	{"link-local", netip.MustParsePrefix("169.254.0.0/16"), true},
	{"link-local", netip.MustParsePrefix("fe80::/10"), true},
	// Dialling an unspecified address reaches this host: the proxy itself.
	{"unspecified", netip.MustParsePrefix("0.0.0.0/32"), false},
	{"unspecified", netip.MustParsePrefix("::/128"), false},
	{"multicast", netip.MustParsePrefix("224.0.0.0/4"), true},
	{"multicast", netip.MustParsePrefix("ff00::/8"), true},
	{"special", netip.MustParsePrefix("0.0.0.0/8"), true},               // "this network"
	{"special", netip.MustParsePrefix("100.100.100.200/32"), true},      // Alibaba Cloud metadata
	{"special", netip.MustParsePrefix("168.63.129.16/32"), true},        // Azure WireServer (goal state, extension settings)
	{"special", netip.MustParsePrefix("fd00:ec2::254/128"), true},       // AWS metadata over IPv6
	{"special", netip.MustParsePrefix("fd00:ec2::23/128"), true},        // AWS EKS Pod Identity (credentials) over IPv6
	{"special", netip.MustParsePrefix("fd20:ce::254/128"), true},        // Google Cloud metadata over IPv6
	{"special", netip.MustParsePrefix("255.255.255.255/32"), true},      // limited broadcast
	{"ipv4-mapped", netip.MustParsePrefix("::ffff:0:0/96"), false},      // callers unmap first
	{"ipv4-embedding", netip.MustParsePrefix("::ffff:0:0:0/96"), false}, // SIIT IPv4-translated
	{"ipv4-embedding", netip.MustParsePrefix("64:ff9b::/96"), false},    // NAT64 well-known prefix
	{"ipv4-embedding", netip.MustParsePrefix("64:ff9b:1::/48"), false},  // NAT64 local-use prefix
	{"ipv4-embedding", netip.MustParsePrefix("2002::/16"), false},       // 6to4
	{"ipv4-embedding", netip.MustParsePrefix("2001::/32"), false},       // Teredo
	{"ipv4-embedding", netip.MustParsePrefix("::/96"), false},           // IPv4-compatible (deprecated)
}

// privateClasses are the private-use ranges, refused only when the operator asks for it
// (--deny-private): the sidecar's egress network may be a private one itself, and a
// model host on a private address is common. Matched after internalClasses, so the
// cloud endpoints inside fc00::/7 keep their own class.
var privateClasses = []internalClass{
	{"private", netip.MustParsePrefix("10.0.0.0/8"), true},
	{"private", netip.MustParsePrefix("172.16.0.0/12"), true},
	{"private", netip.MustParsePrefix("192.168.0.0/16"), true},
	{"private", netip.MustParsePrefix("100.64.0.0/10"), true}, // shared address space (carrier-grade NAT)
	{"private", netip.MustParsePrefix("fc00::/7"), true},      // unique local
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

// classify returns the internal class of a, if any. The proxy's own addresses come
// first: 127.0.0.1 on the proxy's host is the proxy, whatever else it is.
func (g *Guard) classify(a netip.Addr) (internalClass, bool) {
	a = a.WithZone("")
	if g.isOwn(a) {
		return internalClass{name: ownClassName, prefix: netip.PrefixFrom(a, a.BitLen()), liftable: true}, true
	}
	for _, c := range internalClasses {
		if c.prefix.Contains(a) {
			return c, true
		}
	}
	if g.denyPrivate {
		for _, c := range privateClasses {
			if c.prefix.Contains(a) {
				return c, true
			}
		}
	}
	return internalClass{}, false
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
	if !c.liftable || m.Mode() != policy.ModeAllowlist {
		return true
	}
	d := m.Decide("", a, port)
	r := d.Rule.Prefix
	return !d.Allowed || !d.Rule.IsAddress() || r.Bits() < c.prefix.Bits() || !c.prefix.Contains(r.Addr())
}
