package policy

import (
	"net/netip"
	"strings"
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
)

// Decision is the outcome of one check.
type Decision struct {
	Allowed bool
	Reason  Reason
	// Rule is the rule that decided; its Kind is zero when no rule matched.
	Rule Target
}

// Matcher is a compiled policy. It is immutable and safe for concurrent use.
type Matcher struct {
	policy Policy
}

// Compile builds the matcher of a valid policy.
func Compile(p Policy) *Matcher {
	return &Matcher{policy: p}
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
// match addr. port is the destination port; port 0 asks whether some port could be
// allowed (an allowlist rule for any port matches; a denylist rule denies only if it
// covers every port). Decide does not allocate.
func (m *Matcher) Decide(name string, addr netip.Addr, port uint16) Decision {
	switch m.policy.Mode {
	case ModePublic:
		return Decision{Allowed: true, Reason: ReasonPublic}
	case ModeAllowlist:
		for _, t := range m.policy.Targets {
			if t.matches(name, addr) && (t.Port == 0 || port == 0 || t.Port == port) {
				return Decision{Allowed: true, Reason: ReasonAllowlisted, Rule: t}
			}
		}
		return Decision{Reason: ReasonNotAllowlisted}
	case ModeDenylist:
		for _, t := range m.policy.Targets {
			if t.matches(name, addr) && (t.Port == 0 || t.Port == port) {
				return Decision{Reason: ReasonDenylisted, Rule: t}
			}
		}
		return Decision{Allowed: true, Reason: ReasonNotDenylisted}
	}
	return Decision{Reason: ReasonNoNetwork}
}

// AllowsAddrExplicitly reports whether an IP or CIDR rule of an allowlist covers addr on
// port (0: some port). Only such a rule lifts the proxy's internal-address guard.
func (m *Matcher) AllowsAddrExplicitly(addr netip.Addr, port uint16) bool {
	if m.policy.Mode != ModeAllowlist {
		return false
	}
	d := m.Decide("", addr, port)
	return d.Allowed && d.Rule.IsAddress()
}

// HasAddressRules reports whether the policy has any IP or CIDR rule, which is what lets
// a name that no host rule matches still resolve (its addresses are checked afterwards).
func (m *Matcher) HasAddressRules() bool {
	for _, t := range m.policy.Targets {
		if t.IsAddress() {
			return true
		}
	}
	return false
}

func (t Target) matches(name string, addr netip.Addr) bool {
	switch t.Kind {
	case KindHost:
		return name != "" && name == t.Host
	case KindWildcard:
		return len(name) > len(t.Host)+1 && strings.HasSuffix(name, t.Host) && name[len(name)-len(t.Host)-1] == '.'
	case KindAddr, KindPrefix:
		return addr.IsValid() && t.Prefix.Contains(addr)
	}
	return false
}
