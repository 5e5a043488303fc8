package policy

import (
	"hash/maphash"
	"net/netip"
)

// Reason is the machine-readable why of a Decision. The values are stable: logs,
// metrics labels and the proxy's X-Compass-Egress header carry them.
type Reason string

const (
	ReasonPublic         Reason = "public"          // allowed: the policy is public
	ReasonNoNetwork      Reason = "no-network"      // denied: the policy is no-network
	ReasonAllowlisted    Reason = "allowlisted"     // allowed: a rule of the allowlist matched
	ReasonNotAllowlisted Reason = "not-allowlisted" // denied: no rule of the allowlist matched
	ReasonDenylisted     Reason = "denylisted"      // denied: a rule of the denylist matched
	ReasonNotDenylisted  Reason = "not-denylisted"  // allowed: no rule of the denylist matched
	// ReasonInternalAddress is the sidecar's guard's (docs/proxy.md), which the matcher does
	// not apply: planning gives it for an address endpoint of an internal class that no
	// rule inside the class allows.
	ReasonInternalAddress Reason = "internal-address"
)

// Decision is the outcome of one check.
type Decision struct {
	Allowed bool
	Reason  Reason
	// Rule is the rule that decided; its Kind is zero when no rule matched.
	Rule Target
}

// Matcher is a compiled policy. It is immutable and safe for concurrent use.
//
// A decision costs the same whatever the number of rules: one hash lookup for the exact
// name, one per label of the name for wildcard suffixes, and for the address an indexed
// search plus a walk over at most one enclosing prefix per length (see hostSet, ipSet).
type Matcher struct {
	policy       Policy
	hosts        hostSet
	addrs        ipSet
	addressRules bool
}

// Compile builds the matcher of a valid policy. The matcher reports the policy's own
// Targets as its rules and indexes them, so the caller must not modify them afterwards.
func Compile(p Policy) *Matcher {
	m := &Matcher{policy: p}
	if p.Mode == ModeAllowlist || p.Mode == ModeDenylist {
		m.hosts = newHostSet(p.Targets, maphash.MakeSeed())
		m.addrs = newIPSet(p.Targets)
		m.addressRules = !m.addrs.empty()
	}
	return m
}

// Policy returns the policy the matcher was compiled from.
func (m *Matcher) Policy() Policy { return m.policy }

// Mode returns the policy's mode.
func (m *Matcher) Mode() Mode { return m.policy.Mode }

// Decide says whether a connection is allowed.
//
// name is the requested host name in canonical form (see CanonicalHostname), or "" when
// the client asked for an address. addr is the address that will be dialled, or the zero
// Addr when it is not known yet. Host and wildcard rules match name; IP and CIDR rules
// match addr, as netip.Prefix.Contains does: an IPv4-mapped IPv6 address is IPv6 (pass
// addr.Unmap() to have it match IPv4 rules) and a zoned address matches no rule. port
// is the destination port; port 0 asks whether some port could be allowed (an
// allowlist rule for any port matches; a denylist rule denies only if it covers every
// port).
//
// The reported rule: host rules before address rules; an exact name before a wildcard,
// a longer wildcard suffix before a shorter one; the most specific covering prefix
// whose port matches; for one name or prefix, the rule naming the port before the one
// covering every port (for port 0: the every-port rule, else the lowest port). Decide
// does not allocate.
func (m *Matcher) Decide(name string, addr netip.Addr, port uint16) Decision {
	switch m.policy.Mode {
	case ModePublic:
		return Decision{Allowed: true, Reason: ReasonPublic}
	case ModeAllowlist:
		if r := m.match(name, addr, port, true); r >= 0 {
			return Decision{Allowed: true, Reason: ReasonAllowlisted, Rule: m.policy.Targets[r]}
		}
		return Decision{Reason: ReasonNotAllowlisted}
	case ModeDenylist:
		if r := m.match(name, addr, port, false); r >= 0 {
			return Decision{Reason: ReasonDenylisted, Rule: m.policy.Targets[r]}
		}
		return Decision{Allowed: true, Reason: ReasonNotDenylisted}
	}
	return Decision{Reason: ReasonNoNetwork}
}

// match returns the index of the deciding rule, or -1.
func (m *Matcher) match(name string, addr netip.Addr, port uint16, allowlist bool) int {
	// Locate the address before looking up the name, though host rules come first: the
	// two searches read unrelated memory, and starting both lets the reads overlap.
	at := addrSpot{inner: -1}
	if m.addressRules {
		at = m.addrs.locate(addr)
	}
	if r := m.hosts.lookup(m.policy.Targets, name, port, allowlist); r >= 0 {
		return r
	}
	return at.pick(m.policy.Targets, port, allowlist)
}

// AllowsAddrExplicitly reports whether an IP or CIDR rule of an allowlist covers addr on
// port (0: some port). Only such a rule lifts the proxy's internal-address guard.
func (m *Matcher) AllowsAddrExplicitly(addr netip.Addr, port uint16) bool {
	if m.policy.Mode != ModeAllowlist || !m.addressRules {
		return false
	}
	return m.addrs.lookup(m.policy.Targets, addr, port, true) >= 0
}

// HasAddressRules reports whether the policy has any IP or CIDR rule, which is what lets
// a name that no host rule matches still resolve (its addresses are checked afterwards).
func (m *Matcher) HasAddressRules() bool { return m.addressRules }
