package policy

import (
	"net/netip"
	"testing"

	"github.com/compass-egress/compass-egress/net/addrguard"
)

// TestMatcherLifts: only an allowlist's IP or CIDR rule inside a liftable class, the
// rule that allows the address, lifts the guard for it.
func TestMatcherLifts(t *testing.T) {
	loopback, _ := addrguard.Classify(netip.MustParseAddr("127.0.0.1"))
	unspecified, _ := addrguard.Classify(netip.MustParseAddr("0.0.0.0"))
	cases := []struct {
		name  string
		p     Policy
		class addrguard.Class
		addr  string
		port  uint16
		want  bool
	}{
		{"a rule inside the class", compiledPolicy(t, ModeAllowlist, "127.0.0.0/8"), loopback, "127.0.0.2", 80, true},
		{"the one address", compiledPolicy(t, ModeAllowlist, "127.0.0.2:80"), loopback, "127.0.0.2", 80, true},
		{"the address on another port", compiledPolicy(t, ModeAllowlist, "127.0.0.2:80"), loopback, "127.0.0.2", 81, false},
		{"a rule around the class", compiledPolicy(t, ModeAllowlist, "0.0.0.0/0"), loopback, "127.0.0.2", 80, false},
		{"a host rule", compiledPolicy(t, ModeAllowlist, "a.test"), loopback, "127.0.0.2", 80, false},
		{"a class no rule lifts", compiledPolicy(t, ModeAllowlist, "0.0.0.0"), unspecified, "0.0.0.0", 80, false},
		{"a denylist", compiledPolicy(t, ModeDenylist, "a.test"), loopback, "127.0.0.2", 80, false},
		{"public", Public, loopback, "127.0.0.2", 80, false},
	}
	for _, tc := range cases {
		if got := Compile(tc.p).Lifts(tc.class, netip.MustParseAddr(tc.addr), tc.port); got != tc.want {
			t.Errorf("%s: Lifts(%s, %s, %d) = %v, want %v", tc.name, tc.class.Name, tc.addr, tc.port, got, tc.want)
		}
	}
}
