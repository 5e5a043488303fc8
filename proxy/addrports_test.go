package proxy

import (
	"testing"

	"github.com/compass-egress/compass-egress/policy"
)

func TestAddrRulePorts(t *testing.T) {
	cases := []struct {
		doc     string
		covered []uint16
		not     []uint16
	}{
		{`{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, nil, []uint16{22, 443}},
		{`{"network_mode":"allowlist","allowed_hosts":["a.test","203.0.113.10:443","[2001:db8::/32]:8443"]}`, []uint16{443, 8443}, []uint16{22, 80}},
		{`{"network_mode":"allowlist","allowed_hosts":["a.test:22","203.0.113.0/24"]}`, []uint16{22, 443, 1}, nil},
		// Ports in no order in the policy.
		{`{"network_mode":"allowlist","allowed_hosts":["203.0.113.10:8443","203.0.113.11:443","203.0.113.12:22"]}`, []uint16{22, 443, 8443}, []uint16{80}},
		{`"public"`, nil, []uint16{443}},
		{`{"network_mode":"denylist","denied_hosts":["203.0.113.0/24"]}`, nil, []uint16{443}},
	}
	for _, tc := range cases {
		p, err := policy.Parse([]byte(tc.doc))
		if err != nil {
			t.Fatalf("%s: %v", tc.doc, err)
		}
		ports := newAddrRulePorts(p)
		for _, port := range tc.covered {
			if !ports.covers(port) {
				t.Errorf("%s: port %d not covered", tc.doc, port)
			}
		}
		for _, port := range tc.not {
			if ports.covers(port) {
				t.Errorf("%s: port %d covered", tc.doc, port)
			}
		}
	}
}

// TestAddressRulesResolveOnlyForTheirPorts: a name no host rule allows is looked up only
// when an address rule covers the requested port; otherwise it never leaves the proxy.
func TestAddressRulesResolveOnlyForTheirPorts(t *testing.T) {
	res := &rebindingResolver{counts: map[string]int{}}
	h := newHarness(t, func(c *Config) { c.Resolver = res })
	h.apply(`{"network_mode":"allowlist","allowed_hosts":["a.test","203.0.113.10:443"]}`)
	if status, header := h.connectStatus("c2VjcmV0.exfil.test:22"); status != 403 || header != "denied; reason=not-allowlisted" {
		t.Fatalf("port 22: %d %q", status, header)
	}
	count := func(name string) int { res.mu.Lock(); defer res.mu.Unlock(); return res.counts[name] }
	if n := count("c2VjcmV0.exfil.test"); n != 0 {
		t.Fatalf("a name no rule could allow on port 22 was resolved %d times", n)
	}
	h.connectStatus("maybe.test:443")
	if n := count("maybe.test"); n != 1 {
		t.Fatalf("a name an address rule could allow on port 443 was resolved %d times, want 1", n)
	}
}
