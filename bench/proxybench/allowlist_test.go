package proxybench

import (
	"net/netip"
	"testing"

	"github.com/compass-egress/compass-egress/policy"
)

func TestLargeAllowlist(t *testing.T) {
	const n = 100_000
	data, err := LargeAllowlist(n, "127.0.0.1/32")
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse(data)
	if err != nil {
		t.Fatalf("the generated allowlist does not parse: %v", err)
	}
	if len(p.Targets) != n {
		t.Errorf("%d targets after parsing (duplicates dropped?), want %d", len(p.Targets), n)
	}
	kinds := map[policy.Kind]int{}
	for _, tg := range p.Targets {
		kinds[tg.Kind]++
	}
	for _, k := range []policy.Kind{policy.KindHost, policy.KindWildcard, policy.KindAddr, policy.KindPrefix} {
		if kinds[k] == 0 {
			t.Errorf("no %v entry in the allowlist", k)
		}
	}
	m := policy.Compile(p)
	upstream := netip.MustParseAddr("127.0.0.1")
	if d := m.Decide("", upstream, 40000); !d.Allowed {
		t.Errorf("the upstream address is not allowed: %+v", d)
	}
	if d := m.Decide("", netip.MustParseAddr("127.0.0.2"), 40000); d.Allowed {
		t.Errorf("127.0.0.2 is allowed by %v; only the upstream should be", d.Rule)
	}
	if _, err := LargeAllowlist(0, "127.0.0.1"); err == nil {
		t.Error("an allowlist of 0 entries was built")
	}
}
