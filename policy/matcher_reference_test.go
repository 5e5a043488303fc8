package policy

import (
	"net/netip"
	"strings"
)

// linearMatcher is the reference implementation of Matcher: one pass over every rule,
// keeping the best match by the order Decide documents. Tests and FuzzDecide compare
// the compiled matcher with it, and the benchmarks measure against it.
type linearMatcher struct{ policy Policy }

func (l linearMatcher) Decide(name string, addr netip.Addr, port uint16) Decision {
	switch l.policy.Mode {
	case ModePublic:
		return Decision{Allowed: true, Reason: ReasonPublic}
	case ModeAllowlist:
		if r := l.best(name, addr, port, true, false); r >= 0 {
			return Decision{Allowed: true, Reason: ReasonAllowlisted, Rule: l.policy.Targets[r]}
		}
		return Decision{Reason: ReasonNotAllowlisted}
	case ModeDenylist:
		if r := l.best(name, addr, port, false, false); r >= 0 {
			return Decision{Reason: ReasonDenylisted, Rule: l.policy.Targets[r]}
		}
		return Decision{Allowed: true, Reason: ReasonNotDenylisted}
	}
	return Decision{Reason: ReasonNoNetwork}
}

func (l linearMatcher) AllowsAddrExplicitly(addr netip.Addr, port uint16) bool {
	return l.policy.Mode == ModeAllowlist && l.best("", addr, port, true, true) >= 0
}

func (l linearMatcher) HasAddressRules() bool {
	for _, t := range l.policy.Targets {
		if t.IsAddress() && t.Prefix.IsValid() {
			return true
		}
	}
	return false
}

// best returns the index of the deciding rule, or -1.
func (l linearMatcher) best(name string, addr netip.Addr, port uint16, allowlist, addressOnly bool) int {
	best := -1
	for i, t := range l.policy.Targets {
		if addressOnly && !t.IsAddress() {
			continue
		}
		if !t.matches(name, addr) || !portCovered(t.Port, port, allowlist) {
			continue
		}
		if best < 0 || rankLess(t, l.policy.Targets[best], port) {
			best = i
		}
	}
	return best
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

// portCovered: a rule's port 0 covers every port; a question about port 0 ("some
// port") is answered by any allowlist rule but only by an every-port denylist rule.
func portCovered(rulePort, port uint16, allowlist bool) bool {
	return rulePort == 0 || rulePort == port || (port == 0 && allowlist)
}

// rankLess reports whether matching rule a reports before matching rule b (b was
// written first, so a equal rank keeps b).
func rankLess(a, b Target, port uint16) bool {
	ka, kb := rankOf(a, port), rankOf(b, port)
	for i := range ka {
		if ka[i] != kb[i] {
			return ka[i] < kb[i]
		}
	}
	return false
}

// rankOf: kind class (exact name, wildcard, address), then specificity (longer suffix,
// longer prefix), then port (the asked port before every port; for port 0, every port
// before the lowest port).
func rankOf(t Target, port uint16) [3]int {
	var class, specific int
	switch t.Kind {
	case KindHost:
		class = 0
	case KindWildcard:
		class, specific = 1, -len(t.Host)
	default:
		class, specific = 2, -t.Prefix.Bits()
	}
	portRank := int(t.Port)
	if port != 0 {
		portRank = 0
		if t.Port == 0 {
			portRank = 1
		}
	}
	return [3]int{class, specific, portRank}
}
