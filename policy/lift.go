package policy

import (
	"net/netip"

	"github.com/compass-egress/compass-egress/net/addrguard"
)

// Lifts reports whether m lifts the internal-address class c for a connection to a (in
// c) on port: c is liftable and an allowlist IP or CIDR rule inside c's prefix is what
// allows it. It makes m the addrguard.Lifter that the sidecar's guard and planning ask.
func (m *Matcher) Lifts(c addrguard.Class, a netip.Addr, port uint16) bool {
	if !c.Liftable || m.Mode() != ModeAllowlist {
		return false
	}
	d := m.Decide("", a, port)
	r := d.Rule.Prefix
	return d.Allowed && d.Rule.IsAddress() && r.Bits() >= c.Prefix.Bits() && c.Prefix.Contains(r.Addr())
}
