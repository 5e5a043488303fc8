package addrguard

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// ownClassName names the class of the proxy's own addresses. Only a rule naming the
// one address lifts it (docs/proxy.md, "The internal-address guard"); a range around
// it does not, and the proxy's listeners stay refused.
const ownClassName = "proxy-own-address"

// ownRefresh is how old the set of own addresses may grow before it is read again.
const ownRefresh = time.Second

// Lifter is the rule set the guard consults: whether it lifts class c for a connection
// to a (inside c) on port. *policy.Matcher is one.
type Lifter interface {
	Lifts(c Class, a netip.Addr, port uint16) bool
}

// Config is what the guard knows beyond the fixed classes. The zero Config guards the
// fixed classes only, as planning does.
type Config struct {
	// Exempt are the operator's ranges (--allow-internal) that the guard lets through.
	Exempt []netip.Prefix
	// DenyPrivate refuses the private-use ranges too (--deny-private).
	DenyPrivate bool
	// OwnAddrs lists the proxy's own addresses (nil: none). Docker may attach a network
	// after the proxy started, so the set is read again when older than a second.
	OwnAddrs func() []netip.Addr
	// Listeners are the proxy's bound TCP endpoints (unspecified address: every own
	// one), refused always: a tunnel into the proxy is a loop.
	Listeners []netip.AddrPort
}

// Guard refuses internal addresses: loopback, link-local (cloud metadata included),
// unspecified, multicast, IPv4-embedding IPv6 forms and the proxy's own addresses,
// unless an operator range exempts them or a policy rule inside the class lifts it (see
// Refuses). The proxy's own listening endpoints are refused always.
type Guard struct {
	exempt      []netip.Prefix
	denyPrivate bool
	ownAddrs    func() []netip.Addr
	listeners   []netip.AddrPort

	own   atomic.Pointer[ownSet]
	mu    sync.Mutex
	every time.Duration
}

type ownSet struct {
	addrs map[netip.Addr]struct{}
	at    time.Time
}

// New builds a guard from c.
func New(c Config) *Guard {
	g := &Guard{exempt: c.Exempt, denyPrivate: c.DenyPrivate, ownAddrs: c.OwnAddrs, every: ownRefresh}
	if g.ownAddrs == nil {
		g.ownAddrs = func() []netip.Addr { return nil }
	}
	for _, ep := range c.Listeners {
		g.listeners = append(g.listeners, netip.AddrPortFrom(ep.Addr().Unmap().WithZone(""), ep.Port()))
	}
	g.refresh()
	return g
}

// Refuses reports whether the guard refuses a connection to addr (unmapped by the
// caller) on port under rules. The proxy's own listeners are refused always; otherwise
// an exempt range lets addr through, and rules may lift its class.
func (g *Guard) Refuses(rules Lifter, addr netip.Addr, port uint16) bool {
	a := addr.WithZone("")
	if g.ownEndpoint(a, port) {
		return true
	}
	c, internal := g.classify(a)
	if !internal || g.exempts(a) {
		return false
	}
	return !rules.Lifts(c, a, port)
}

// classify returns the internal class of a, if any: the fixed classes, the proxy's own
// addresses and, with DenyPrivate, the private ranges. The proxy's own addresses come
// first: 127.0.0.1 on the proxy's host is the proxy, whatever else it is.
func (g *Guard) classify(a netip.Addr) (Class, bool) {
	a = a.WithZone("")
	if g.isOwn(a) {
		return Class{Name: ownClassName, Prefix: netip.PrefixFrom(a, a.BitLen()), Liftable: true}, true
	}
	if c, ok := Classify(a); ok {
		return c, true
	}
	if g.denyPrivate {
		return classifyIn(privateClasses, a)
	}
	return Class{}, false
}

// exempts reports whether an operator range covers a.
func (g *Guard) exempts(a netip.Addr) bool {
	for _, p := range g.exempt {
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
