package egresslink

import (
	"net/netip"
	"testing"
)

// Every slot is a distinct /30 outside the reserved /24s, with short names.
func TestForSlotIsUniqueAndAvoidsReservedRanges(t *testing.T) {
	reserved := []netip.Prefix{
		netip.MustParsePrefix("169.254.0.0/24"), netip.MustParsePrefix("169.254.169.0/24"), netip.MustParsePrefix("169.254.255.0/24"),
	}
	seen := map[netip.Prefix]int{}
	names := map[string]int{}
	for n := 0; n < Slots; n++ {
		s, err := ForSlot(n, netip.MustParseAddr("10.213.0.2"), netip.MustParseAddrPort("10.213.0.2:53"), 15001)
		if err != nil {
			t.Fatalf("slot %d: %v", n, err)
		}
		p := s.Link.AgentAddr.Masked()
		if m, dup := seen[p]; dup {
			t.Fatalf("slots %d and %d both get %v", m, n, p)
		}
		seen[p] = n
		if m, dup := names[s.Link.AgentName]; dup {
			t.Fatalf("slots %d and %d both get %s", m, n, s.Link.AgentName)
		}
		names[s.Link.AgentName] = n
		for _, r := range reserved {
			if r.Overlaps(p) {
				t.Fatalf("slot %d: %v is in %v", n, p, r)
			}
		}
	}
	for _, n := range []int{-1, Slots} {
		if _, err := ForSlot(n, netip.MustParseAddr("10.213.0.2"), netip.MustParseAddrPort("10.213.0.2:53"), 15001); err == nil {
			t.Errorf("ForSlot(%d) succeeded", n)
		}
	}
}
