// Package addrguard holds the internal-address classes and the guard that refuses them.
// The sidecar refuses a connection to such an address unless a policy rule inside its
// class lifts it; planning (package policy) and compassctl's policy check apply the same
// classes, so a plan that passes is one the sidecar will carry out. The rule set is
// reached through Lifter, so the package needs nothing beyond the standard library.
package addrguard

import "net/netip"

// Class is a range the guard refuses. An allowlist's IP or CIDR rule lifts the guard
// only for a liftable class and only when the rule lies inside the class's prefix:
// "127.0.0.0/8" opens loopback, "0.0.0.0/0" opens nothing internal.
type Class struct {
	Name     string
	Prefix   netip.Prefix
	Liftable bool
}

// fixedClasses in match order: specific ranges before the ranges that contain them
// (::1 and :: lie inside ::/96).
var fixedClasses = []Class{
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
// model host on a private address is common. Matched after fixedClasses, so the cloud
// endpoints inside fc00::/7 keep their own class.
var privateClasses = []Class{
	{"private", netip.MustParsePrefix("10.0.0.0/8"), true},
	{"private", netip.MustParsePrefix("172.16.0.0/12"), true},
	{"private", netip.MustParsePrefix("192.168.0.0/16"), true},
	{"private", netip.MustParsePrefix("100.64.0.0/10"), true}, // shared address space (carrier-grade NAT)
	{"private", netip.MustParsePrefix("fc00::/7"), true},      // unique local
}

// Classify returns the fixed internal class of a (zone ignored; the caller unmaps), if
// it has one. The proxy's own addresses and the operator's choices (--allow-internal,
// --deny-private) are the Guard's to add: planning cannot know them.
func Classify(a netip.Addr) (Class, bool) {
	return classifyIn(fixedClasses, a.WithZone(""))
}

func classifyIn(classes []Class, a netip.Addr) (Class, bool) {
	for _, c := range classes {
		if c.Prefix.Contains(a) {
			return c, true
		}
	}
	return Class{}, false
}
