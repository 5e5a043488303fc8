package policy

import (
	"net/netip"
	"strings"
	"testing"
)

// compiledPolicy builds a policy of mode from target strings written as in a policy.
func compiledPolicy(t testing.TB, mode Mode, targets ...string) Policy {
	t.Helper()
	p := Policy{Mode: mode}
	for _, s := range targets {
		tg, err := ParseTarget(s)
		if err != nil {
			t.Fatalf("ParseTarget(%q): %v", s, err)
		}
		p.Targets = append(p.Targets, tg)
	}
	return p
}

func addrOrZero(s string) netip.Addr {
	if s == "" {
		return netip.Addr{}
	}
	return netip.MustParseAddr(s)
}

func TestDecide(t *testing.T) {
	type query struct {
		name, addr string
		port       uint16
		allowed    bool
		reason     Reason
		rule       string // the reported rule's canonical form, "" for none
	}
	cases := []struct {
		name    string
		mode    Mode
		targets []string
		queries []query
	}{
		{"public allows everything", ModePublic, nil, []query{
			{"any.test", "192.0.2.1", 443, true, ReasonPublic, ""},
			{"", "", 0, true, ReasonPublic, ""},
		}},
		{"no-network denies everything", ModeNoNetwork, nil, []query{
			{"any.test", "192.0.2.1", 443, false, ReasonNoNetwork, ""},
			{"", "", 0, false, ReasonNoNetwork, ""},
		}},
		{"empty allowlist allows nothing", ModeAllowlist, nil, []query{
			{"any.test", "192.0.2.1", 443, false, ReasonNotAllowlisted, ""},
		}},
		{"empty denylist denies nothing", ModeDenylist, nil, []query{
			{"any.test", "192.0.2.1", 443, true, ReasonNotDenylisted, ""},
		}},
		{"allowlist host on every port", ModeAllowlist, []string{"pypi.test"}, []query{
			{"pypi.test", "", 443, true, ReasonAllowlisted, "pypi.test"},
			{"pypi.test", "", 1, true, ReasonAllowlisted, "pypi.test"},
			{"pypi.test", "", 0, true, ReasonAllowlisted, "pypi.test"},
			{"www.pypi.test", "", 443, false, ReasonNotAllowlisted, ""},
			{"pypi.test.evil.test", "", 443, false, ReasonNotAllowlisted, ""},
			{"", "", 443, false, ReasonNotAllowlisted, ""},
		}},
		{"allowlist host on one port", ModeAllowlist, []string{"api.test:443"}, []query{
			{"api.test", "", 443, true, ReasonAllowlisted, "api.test:443"},
			{"api.test", "", 80, false, ReasonNotAllowlisted, ""},
			{"api.test", "", 0, true, ReasonAllowlisted, "api.test:443"},
		}},
		{"allowlist host on several ports", ModeAllowlist, []string{"api.test:8443", "api.test:443"}, []query{
			{"api.test", "", 8443, true, ReasonAllowlisted, "api.test:8443"},
			{"api.test", "", 443, true, ReasonAllowlisted, "api.test:443"},
			{"api.test", "", 80, false, ReasonNotAllowlisted, ""},
			{"api.test", "", 0, true, ReasonAllowlisted, "api.test:443"}, // the lowest port
		}},
		{"the rule naming the port before the every-port rule", ModeAllowlist, []string{"api.test", "api.test:443"}, []query{
			{"api.test", "", 443, true, ReasonAllowlisted, "api.test:443"},
			{"api.test", "", 80, true, ReasonAllowlisted, "api.test"},
			{"api.test", "", 0, true, ReasonAllowlisted, "api.test"},
		}},
		{"wildcard never matches its base name", ModeAllowlist, []string{"*.example.test"}, []query{
			{"a.example.test", "", 443, true, ReasonAllowlisted, "*.example.test"},
			{"a.b.example.test", "", 443, true, ReasonAllowlisted, "*.example.test"},
			{"example.test", "", 443, false, ReasonNotAllowlisted, ""},
			{"xexample.test", "", 443, false, ReasonNotAllowlisted, ""},
			{".example.test", "", 443, false, ReasonNotAllowlisted, ""},
			{"a.example.test.other.test", "", 443, false, ReasonNotAllowlisted, ""},
			{"test", "", 443, false, ReasonNotAllowlisted, ""},
		}},
		{"a leading dot is no label", ModeAllowlist, []string{"*.test", "*.example.test"}, []query{
			{".example.test", "", 443, true, ReasonAllowlisted, "*.test"},
			{"..example.test", "", 443, true, ReasonAllowlisted, "*.example.test"},
			{".test", "", 443, false, ReasonNotAllowlisted, ""},
		}},
		{"wildcard with a port", ModeAllowlist, []string{"*.example.test:443"}, []query{
			{"a.example.test", "", 443, true, ReasonAllowlisted, "*.example.test:443"},
			{"a.example.test", "", 80, false, ReasonNotAllowlisted, ""},
			{"a.example.test", "", 0, true, ReasonAllowlisted, "*.example.test:443"},
		}},
		{"exact name before wildcard, longer suffix first", ModeAllowlist,
			[]string{"*.example.test", "*.b.example.test", "www.b.example.test"}, []query{
				{"www.b.example.test", "", 443, true, ReasonAllowlisted, "www.b.example.test"},
				{"a.b.example.test", "", 443, true, ReasonAllowlisted, "*.b.example.test"},
				{"b.example.test", "", 443, true, ReasonAllowlisted, "*.example.test"},
			}},
		{"a longer wildcard on another port gives way to a shorter one", ModeAllowlist,
			[]string{"*.b.example.test:8443", "*.example.test:443"}, []query{
				{"a.b.example.test", "", 443, true, ReasonAllowlisted, "*.example.test:443"},
				{"a.b.example.test", "", 8443, true, ReasonAllowlisted, "*.b.example.test:8443"},
				{"a.b.example.test", "", 80, false, ReasonNotAllowlisted, ""},
			}},
		{"an exact name on another port gives way to a wildcard", ModeAllowlist,
			[]string{"www.example.test:80", "*.example.test:443"}, []query{
				{"www.example.test", "", 443, true, ReasonAllowlisted, "*.example.test:443"},
				{"www.example.test", "", 80, true, ReasonAllowlisted, "www.example.test:80"},
			}},
		{"IPv4 address", ModeAllowlist, []string{"203.0.113.10"}, []query{
			{"", "203.0.113.10", 443, true, ReasonAllowlisted, "203.0.113.10"},
			{"some.test", "203.0.113.10", 443, true, ReasonAllowlisted, "203.0.113.10"},
			{"", "203.0.113.11", 443, false, ReasonNotAllowlisted, ""},
			{"", "203.0.113.9", 443, false, ReasonNotAllowlisted, ""},
			{"203.0.113.10", "", 443, false, ReasonNotAllowlisted, ""}, // a name is not an address
			{"", "", 443, false, ReasonNotAllowlisted, ""},
		}},
		{"IPv4 rule and IPv4-mapped IPv6 address", ModeAllowlist, []string{"203.0.113.10", "0.0.0.0/0"}, []query{
			{"", "::ffff:203.0.113.10", 443, false, ReasonNotAllowlisted, ""},
		}},
		{"nested IPv4 CIDRs with different ports", ModeAllowlist,
			[]string{"10.0.0.0/8:443", "10.1.0.0/16:80", "10.1.2.3", "10.1.2.0/24:443"}, []query{
				{"", "10.1.2.3", 22, true, ReasonAllowlisted, "10.1.2.3"},
				{"", "10.1.2.4", 443, true, ReasonAllowlisted, "10.1.2.0/24:443"},
				{"", "10.1.2.4", 80, true, ReasonAllowlisted, "10.1.0.0/16:80"},
				{"", "10.1.2.4", 22, false, ReasonNotAllowlisted, ""},
				{"", "10.1.9.9", 443, true, ReasonAllowlisted, "10.0.0.0/8:443"},
				{"", "10.1.9.9", 80, true, ReasonAllowlisted, "10.1.0.0/16:80"},
				{"", "10.1.9.9", 0, true, ReasonAllowlisted, "10.1.0.0/16:80"},
				{"", "10.2.0.1", 443, true, ReasonAllowlisted, "10.0.0.0/8:443"},
				{"", "10.2.0.1", 80, false, ReasonNotAllowlisted, ""},
				{"", "10.255.255.255", 443, true, ReasonAllowlisted, "10.0.0.0/8:443"},
				{"", "11.0.0.0", 443, false, ReasonNotAllowlisted, ""},
				{"", "9.255.255.255", 443, false, ReasonNotAllowlisted, ""},
			}},
		{"prefixes at the ends of the address space", ModeAllowlist,
			[]string{"0.0.0.0/1:1", "255.255.255.255", "128.0.0.0/1:2", "0.0.0.0/0:3"}, []query{
				{"", "0.0.0.0", 1, true, ReasonAllowlisted, "0.0.0.0/1:1"},
				{"", "0.0.0.0", 3, true, ReasonAllowlisted, "0.0.0.0/0:3"},
				{"", "127.255.255.255", 1, true, ReasonAllowlisted, "0.0.0.0/1:1"},
				{"", "128.0.0.0", 2, true, ReasonAllowlisted, "128.0.0.0/1:2"},
				{"", "255.255.255.255", 9, true, ReasonAllowlisted, "255.255.255.255"},
				{"", "255.255.255.254", 3, true, ReasonAllowlisted, "0.0.0.0/0:3"},
				{"", "255.255.255.254", 9, false, ReasonNotAllowlisted, ""},
				{"", "::", 3, false, ReasonNotAllowlisted, ""},
			}},
		{"IPv6 addresses and ranges", ModeAllowlist,
			[]string{"2001:db8::/32", "[2001:db8::1]:443", "[::/0]:8443", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}, []query{
				{"", "2001:db8::1", 443, true, ReasonAllowlisted, "[2001:db8::1]:443"},
				{"", "2001:db8::1", 80, true, ReasonAllowlisted, "2001:db8::/32"},
				{"", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", 80, true, ReasonAllowlisted, "2001:db8::/32"},
				{"", "2001:db9::", 80, false, ReasonNotAllowlisted, ""},
				{"", "2001:db9::", 8443, true, ReasonAllowlisted, "[::/0]:8443"},
				{"", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 1, true, ReasonAllowlisted, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
				{"", "203.0.113.1", 8443, false, ReasonNotAllowlisted, ""},
				{"", "fe80::1%eth0", 8443, false, ReasonNotAllowlisted, ""}, // zoned: as netip.Prefix.Contains
			}},
		{"host rules before address rules", ModeAllowlist, []string{"10.0.0.0/8", "api.test:443"}, []query{
			{"api.test", "10.0.0.1", 443, true, ReasonAllowlisted, "api.test:443"},
			{"api.test", "10.0.0.1", 80, true, ReasonAllowlisted, "10.0.0.0/8"},
			{"other.test", "10.0.0.1", 80, true, ReasonAllowlisted, "10.0.0.0/8"},
			{"api.test", "192.0.2.1", 80, false, ReasonNotAllowlisted, ""},
		}},
		{"denylist host on one port", ModeDenylist, []string{"registry.test:443"}, []query{
			{"registry.test", "", 443, false, ReasonDenylisted, "registry.test:443"},
			{"registry.test", "", 80, true, ReasonNotDenylisted, ""},
			{"registry.test", "", 0, true, ReasonNotDenylisted, ""}, // does not cover every port
			{"www.registry.test", "", 443, true, ReasonNotDenylisted, ""},
		}},
		{"denylist host on every port", ModeDenylist, []string{"registry.test"}, []query{
			{"registry.test", "", 443, false, ReasonDenylisted, "registry.test"},
			{"registry.test", "", 0, false, ReasonDenylisted, "registry.test"},
			{"", "", 0, true, ReasonNotDenylisted, ""},
		}},
		// Ten port rules for one name: past the linear scan, the group is searched by
		// halves, and every listed port must still be found (docs/policy.md §2: a target with a port
		// matches that port).
		// A suffix of 64 labels or more has its label count kept in the second word of
		// the count set: the walk must still look it up.
		{"denylist wildcard of a 64-label suffix", ModeDenylist, []string{"*." + strings.Repeat("a.", 63) + "test"}, []query{
			{"x." + strings.Repeat("a.", 63) + "test", "", 443, false, ReasonDenylisted, "*." + strings.Repeat("a.", 63) + "test"},
			{"x.y." + strings.Repeat("a.", 63) + "test", "", 443, false, ReasonDenylisted, "*." + strings.Repeat("a.", 63) + "test"},
			{strings.Repeat("a.", 63) + "test", "", 443, true, ReasonNotDenylisted, ""},
		}},
		{"denylist host on many ports", ModeDenylist,
			[]string{"ports.test:21", "ports.test:22", "ports.test:25", "ports.test:80", "ports.test:110",
				"ports.test:143", "ports.test:443", "ports.test:465", "ports.test:587", "ports.test:993"}, []query{
				{"ports.test", "", 21, false, ReasonDenylisted, "ports.test:21"},
				{"ports.test", "", 110, false, ReasonDenylisted, "ports.test:110"},
				{"ports.test", "", 443, false, ReasonDenylisted, "ports.test:443"},
				{"ports.test", "", 993, false, ReasonDenylisted, "ports.test:993"},
				{"ports.test", "", 444, true, ReasonNotDenylisted, ""},
				{"ports.test", "", 8080, true, ReasonNotDenylisted, ""},
				{"ports.test", "", 0, true, ReasonNotDenylisted, ""},
			}},
		{"denylist wildcard", ModeDenylist, []string{"*.registry.test"}, []query{
			{"a.registry.test", "", 443, false, ReasonDenylisted, "*.registry.test"},
			{"registry.test", "", 443, true, ReasonNotDenylisted, ""},
		}},
		{"denylist nested CIDRs with different ports", ModeDenylist,
			[]string{"10.1.0.0/16:443", "10.0.0.0/8", "[2001:db8::/48]:22"}, []query{
				{"", "10.1.0.1", 443, false, ReasonDenylisted, "10.1.0.0/16:443"},
				{"", "10.1.0.1", 80, false, ReasonDenylisted, "10.0.0.0/8"},
				{"", "10.1.0.1", 0, false, ReasonDenylisted, "10.0.0.0/8"},
				{"", "11.0.0.1", 80, true, ReasonNotDenylisted, ""},
				{"", "2001:db8::5", 22, false, ReasonDenylisted, "[2001:db8::/48]:22"},
				{"", "2001:db8::5", 0, true, ReasonNotDenylisted, ""},
				{"", "", 22, true, ReasonNotDenylisted, ""},
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := compiledPolicy(t, tc.mode, tc.targets...)
			m := Compile(p)
			ref := linearMatcher{p}
			for _, q := range tc.queries {
				addr := addrOrZero(q.addr)
				got := m.Decide(q.name, addr, q.port)
				rule := ""
				if got.Rule.Kind != 0 {
					rule = got.Rule.String()
				}
				if got.Allowed != q.allowed || got.Reason != q.reason || rule != q.rule {
					t.Errorf("Decide(%q, %q, %d) = %v %s %q, want %v %s %q",
						q.name, q.addr, q.port, got.Allowed, got.Reason, rule, q.allowed, q.reason, q.rule)
				}
				if want := ref.Decide(q.name, addr, q.port); got != want {
					t.Errorf("Decide(%q, %q, %d) = %+v, the linear reference says %+v", q.name, q.addr, q.port, got, want)
				}
			}
		})
	}
}

func TestDecideHandBuiltPolicies(t *testing.T) {
	// Policies that did not come from the parser: duplicates, a single-address prefix
	// written as KindPrefix, an unmasked prefix, rules with invalid parts, and a
	// wildcard longer than any valid name.
	addr := netip.MustParsePrefix("192.0.2.7/32")
	long := strings.Repeat("a.", 299) + "test"
	p := Policy{Mode: ModeDenylist, Targets: []Target{
		{Kind: KindHost, Host: "dup.test", Port: 443},
		{Kind: KindHost, Host: "dup.test", Port: 443},
		{Kind: KindPrefix, Prefix: addr},
		{Kind: KindAddr, Prefix: addr},
		{Kind: KindPrefix, Prefix: netip.MustParsePrefix("198.51.100.77/24")},
		{Kind: KindPrefix},
		{Kind: KindHost},
		{Kind: 0, Host: "nokind.test"},
		{Kind: KindWildcard, Host: long},
	}}
	m, ref := Compile(p), linearMatcher{p}
	for _, q := range []struct {
		name, addr string
		port       uint16
		wantIndex  int // -1: allowed
	}{
		{"dup.test", "", 443, 0},
		{"", "192.0.2.7", 1, 2},
		{"", "198.51.100.1", 1, 4},
		{"", "", 1, -1},
		{"nokind.test", "", 1, -1},
		{"x." + long, "", 1, 8},
		{long, "", 1, -1},
	} {
		got := m.Decide(q.name, addrOrZero(q.addr), q.port)
		want := Decision{Allowed: true, Reason: ReasonNotDenylisted}
		if q.wantIndex >= 0 {
			want = Decision{Reason: ReasonDenylisted, Rule: p.Targets[q.wantIndex]}
		}
		if got != want {
			t.Errorf("Decide(%q, %q, %d) = %+v, want %+v", q.name, q.addr, q.port, got, want)
		}
		if r := ref.Decide(q.name, addrOrZero(q.addr), q.port); r != got {
			t.Errorf("Decide(%q, %q, %d) = %+v, the linear reference says %+v", q.name, q.addr, q.port, got, r)
		}
	}
}

func TestAllowsAddrExplicitly(t *testing.T) {
	allow := compiledPolicy(t, ModeAllowlist, "api.test", "127.0.0.1:8080", "169.254.0.0/16")
	deny := compiledPolicy(t, ModeDenylist, "127.0.0.1")
	cases := []struct {
		name string
		p    Policy
		addr string
		port uint16
		want bool
	}{
		{"address rule on its port", allow, "127.0.0.1", 8080, true},
		{"address rule, some port", allow, "127.0.0.1", 0, true},
		{"address rule on another port", allow, "127.0.0.1", 80, false},
		{"CIDR rule", allow, "169.254.169.254", 80, true},
		{"not covered", allow, "127.0.0.2", 8080, false},
		{"no address", allow, "", 8080, false},
		{"denylist never lifts the guard", deny, "127.0.0.1", 80, false},
		{"public never lifts the guard", Public, "127.0.0.1", 80, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Compile(tc.p).AllowsAddrExplicitly(addrOrZero(tc.addr), tc.port); got != tc.want {
				t.Errorf("AllowsAddrExplicitly(%q, %d) = %v, want %v", tc.addr, tc.port, got, tc.want)
			}
			if ref := (linearMatcher{tc.p}).AllowsAddrExplicitly(addrOrZero(tc.addr), tc.port); ref != tc.want {
				t.Errorf("the linear reference says %v, want %v", ref, tc.want)
			}
		})
	}
}

func TestHasAddressRules(t *testing.T) {
	cases := []struct {
		name string
		p    Policy
		want bool
	}{
		{"hosts only", compiledPolicy(t, ModeAllowlist, "api.test", "*.api.test"), false},
		{"an IPv4 address", compiledPolicy(t, ModeAllowlist, "api.test", "192.0.2.1"), true},
		{"an IPv6 range", compiledPolicy(t, ModeDenylist, "2001:db8::/32"), true},
		{"public", Public, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Compile(tc.p).HasAddressRules(); got != tc.want {
				t.Errorf("HasAddressRules() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCompileKeepsPolicy(t *testing.T) {
	p := compiledPolicy(t, ModeAllowlist, "api.test:443", "10.0.0.0/8")
	m := Compile(p)
	if !m.Policy().Equal(p) || m.Mode() != ModeAllowlist {
		t.Errorf("Policy() = %v, Mode() = %s; want %v, allowlist", m.Policy(), m.Mode(), p)
	}
}

func TestDecideDoesNotAllocate(t *testing.T) {
	m := Compile(compiledPolicy(t, ModeAllowlist, "api.test:443", "*.example.test", "10.0.0.0/8", "2001:db8::/32"))
	addr4, addr6 := netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("2001:db8::1")
	allocs := testing.AllocsPerRun(100, func() {
		m.Decide("a.b.example.test", addr4, 443)
		m.Decide("miss.other.test", addr6, 80)
		m.Decide("", netip.Addr{}, 0)
	})
	if allocs != 0 {
		t.Errorf("Decide allocates %.1f times per call, want 0", allocs)
	}
}
