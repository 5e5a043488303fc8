package policy

import "net/netip"

// InternalClass is a range the sidecar's internal-address guard refuses (SPEC §7). An
// allowlist's IP or CIDR rule lifts the guard only for a liftable class and only when
// the rule lies inside the class's prefix: "127.0.0.0/8" opens loopback, "0.0.0.0/0"
// opens nothing internal. The table lives here, not in the proxy, so that planning
// checks a recipe's required endpoints as the sidecar will treat them.
type InternalClass struct {
	Name     string
	Prefix   netip.Prefix
	Liftable bool
}

// internalClasses in match order: specific ranges before the ranges that contain them
// (::1 and :: lie inside ::/96).
var internalClasses = []InternalClass{
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

// ClassifyInternal returns the internal class of a (zone ignored; the caller unmaps),
// if it has one. The proxy's own addresses and the operator's choices (--allow-internal,
// --deny-private) are the proxy's to add: planning cannot know them.
func ClassifyInternal(a netip.Addr) (InternalClass, bool) {
	a = a.WithZone("")
	for _, c := range internalClasses {
		if c.Prefix.Contains(a) {
			return c, true
		}
	}
	return InternalClass{}, false
}

// LiftedBy reports whether m lifts c for a connection to a (in c) on port: c is
// liftable and an allowlist IP or CIDR rule inside c's prefix is what allows it.
func (c InternalClass) LiftedBy(m *Matcher, a netip.Addr, port uint16) bool {
	if !c.Liftable || m.Mode() != ModeAllowlist {
		return false
	}
	d := m.Decide("", a, port)
	r := d.Rule.Prefix
	return d.Allowed && d.Rule.IsAddress() && r.Bits() >= c.Prefix.Bits() && c.Prefix.Contains(r.Addr())
}
