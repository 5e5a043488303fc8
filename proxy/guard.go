package proxy

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// embeddingPrefixes are IPv6 ranges whose addresses carry an IPv4 address that a relay,
// translator or dual stack may turn into an IPv4 connection: a path to an internal IPv4
// address written as a public-looking IPv6 one.
var embeddingPrefixes = []netip.Prefix{
	netip.MustParsePrefix("64:ff9b::/96"),   // NAT64 well-known prefix
	netip.MustParsePrefix("64:ff9b:1::/48"), // NAT64 local-use prefix
	netip.MustParsePrefix("2002::/16"),      // 6to4
	netip.MustParsePrefix("2001::/32"),      // Teredo
	netip.MustParsePrefix("::/96"),          // IPv4-compatible (deprecated)
}

// specialPrefixes are further addresses a sandbox must not reach by default.
var specialPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),          // "this network"
	netip.MustParsePrefix("100.100.100.200/32"), // Alibaba Cloud metadata
	netip.MustParsePrefix("fd00:ec2::254/128"),  // AWS metadata over IPv6
	netip.MustParsePrefix("255.255.255.255/32"), // limited broadcast
}

// Guard refuses internal addresses: loopback, link-local (cloud metadata included),
// unspecified, multicast, IPv4-embedding IPv6 forms and the proxy's own addresses,
// unless an operator range (--allow-internal) exempts them. A policy's explicit IP or
// CIDR rule exemption is checked by the caller, who holds the rule set.
type Guard struct {
	allow []netip.Prefix
	// ownAddrs lists the proxy's own addresses. Docker may attach a network after the
	// proxy started, so the set is refreshed when older than ownRefresh.
	ownAddrs func() []netip.Addr
	own      atomic.Pointer[ownSet]
	mu       sync.Mutex
	every    time.Duration
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

// Internal reports whether addr is an internal address and, if so, which class.
func (g *Guard) Internal(addr netip.Addr) (bool, string) {
	a := addr.WithZone("")
	switch {
	case a.Is4In6():
		return true, "ipv4-mapped"
	case a.IsLoopback():
		return true, "loopback"
	case a.IsLinkLocalUnicast():
		return true, "link-local"
	case a.IsUnspecified():
		return true, "unspecified"
	case a.IsMulticast():
		return true, "multicast"
	}
	if a.Is6() {
		for _, p := range embeddingPrefixes {
			if p.Contains(a) {
				return true, "ipv4-embedding"
			}
		}
	}
	for _, p := range specialPrefixes {
		if p.Contains(a) {
			return true, "special"
		}
	}
	if g.isOwn(a) {
		return true, "proxy-own-address"
	}
	return false, ""
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
