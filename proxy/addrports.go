package proxy

import (
	"slices"

	"github.com/compass-egress/compass-egress/policy"
)

// addrRulePorts says which ports an allowlist's IP and CIDR rules could allow. A name no
// host rule allows is resolved only to see whether such a rule allows one of its
// addresses; when no address rule covers the requested port the answer cannot matter,
// and the lookup would only carry the name to the upstream resolver.
type addrRulePorts struct {
	anyPort bool     // an address rule covers every port
	ports   []uint16 // sorted ports of the address rules naming one
}

// newAddrRulePorts is computed once per rule set.
func newAddrRulePorts(p policy.Policy) addrRulePorts {
	var a addrRulePorts
	if p.Mode != policy.ModeAllowlist {
		return a
	}
	for _, t := range p.Targets {
		if !t.IsAddress() {
			continue
		}
		if t.Port == 0 {
			return addrRulePorts{anyPort: true}
		}
		a.ports = append(a.ports, t.Port)
	}
	slices.Sort(a.ports)
	a.ports = slices.Compact(a.ports)
	return a
}

// covers reports whether some address rule could allow port.
func (a addrRulePorts) covers(port uint16) bool {
	if a.anyPort {
		return true
	}
	_, found := slices.BinarySearch(a.ports, port)
	return found
}
