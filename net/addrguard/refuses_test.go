package addrguard_test

// The guard's decisions under real rule sets: policy's Matcher is the Lifter the sidecar
// hands it. An external test package, since policy imports addrguard.

import (
	"net/netip"
	"testing"

	"github.com/compass-egress/compass-egress/net/addrguard"
	"github.com/compass-egress/compass-egress/policy"
)

// TestGuardRefusesSpecialAddresses: the cloud endpoints outside the link-local ranges
// are refused in every mode, also when a broad rule allows them; only a rule naming one
// lifts it. IPv6 reaches the metadata and credential endpoints outside fe80::/10 (the
// unique-local range fc00::/7 covers them); Azure's WireServer (168.63.129.16), which a
// VM reaches for its goal state, extension settings and certificates, lies outside every
// private range, so only its own class keeps a name that resolves to it (a denylist, a
// rebinding wildcard) or a broad rule from reaching it.
func TestGuardRefusesSpecialAddresses(t *testing.T) {
	g := addrguard.New(addrguard.Config{})
	for _, tc := range []struct {
		addrs   []string
		policy  string
		refused bool
	}{
		{[]string{"fd20:ce::254", "fd00:ec2::23"}, `"public"`, true},
		{[]string{"fd20:ce::254", "fd00:ec2::23"}, `{"network_mode":"denylist","denied_hosts":[]}`, true},
		{[]string{"fd20:ce::254", "fd00:ec2::23"}, `{"network_mode":"allowlist","allowed_hosts":["fc00::/7"]}`, true},
		{[]string{"fd20:ce::254", "fd00:ec2::23"}, `{"network_mode":"allowlist","allowed_hosts":["fd20:ce::254","fd00:ec2::23"]}`, false},
		{[]string{"168.63.129.16"}, `"public"`, true},
		{[]string{"168.63.129.16"}, `{"network_mode":"denylist","denied_hosts":[]}`, true},
		{[]string{"168.63.129.16"}, `{"network_mode":"allowlist","allowed_hosts":["0.0.0.0/0"]}`, true},
		{[]string{"168.63.129.16"}, `{"network_mode":"allowlist","allowed_hosts":["168.63.0.0/16"]}`, true},
		{[]string{"168.63.129.16"}, `{"network_mode":"allowlist","allowed_hosts":["168.63.129.16"]}`, false},
		// A rule around the "this network" range is no rule inside it.
		{[]string{"0.1.2.3"}, `{"network_mode":"allowlist","allowed_hosts":["0.0.0.0/0"]}`, true},
		{[]string{"0.1.2.3"}, `{"network_mode":"allowlist","allowed_hosts":["0.0.0.0/8"]}`, false},
		// The unspecified address (this host) and the IPv4-embedding forms (an IPv4
		// address of any class inside) are lifted by no rule, not even one naming them.
		{[]string{"0.0.0.0"}, `{"network_mode":"allowlist","allowed_hosts":["0.0.0.0"]}`, true},
		{[]string{"::"}, `{"network_mode":"allowlist","allowed_hosts":["::"]}`, true},
		{[]string{"64:ff9b::a9fe:a9fe"}, `{"network_mode":"allowlist","allowed_hosts":["64:ff9b::/96"]}`, true},
		{[]string{"64:ff9b:1::a9fe:a9fe"}, `{"network_mode":"allowlist","allowed_hosts":["64:ff9b:1::/48"]}`, true},
		{[]string{"2002:a9fe:a9fe::1"}, `{"network_mode":"allowlist","allowed_hosts":["2002::/16"]}`, true},
		{[]string{"2001:0:a9fe::1"}, `{"network_mode":"allowlist","allowed_hosts":["2001::/32"]}`, true},
		{[]string{"::a9fe:a9fe"}, `{"network_mode":"allowlist","allowed_hosts":["::a9fe:a9fe"]}`, true},
		{[]string{"::ffff:0:a9fe:a9fe"}, `{"network_mode":"allowlist","allowed_hosts":["::ffff:0:a9fe:a9fe"]}`, true},
		// Refuses expects an unmapped address; given a mapped one, it still refuses.
		{[]string{"::ffff:169.254.169.254"}, `{"network_mode":"allowlist","allowed_hosts":["::ffff:0:0/96"]}`, true},
	} {
		p, err := policy.Parse([]byte(tc.policy))
		if err != nil {
			t.Fatal(err)
		}
		m := policy.Compile(p)
		for _, addr := range tc.addrs {
			for _, port := range []uint16{80, 32526} {
				if got := g.Refuses(m, netip.MustParseAddr(addr), port); got != tc.refused {
					t.Errorf("%s %s port %d: refused %v, want %v", tc.policy, addr, port, got, tc.refused)
				}
			}
		}
	}
}

// TestGuardOwnAddressLiftedOnlyByItsRule: a rule naming one of the proxy's own
// addresses opens it (docs/proxy.md, "The internal-address guard"); a range around it does not, nor does any rule open the
// proxy's own listeners there.
func TestGuardOwnAddressLiftedOnlyByItsRule(t *testing.T) {
	own := netip.MustParseAddr("172.18.0.2")
	g := addrguard.New(addrguard.Config{
		OwnAddrs:  func() []netip.Addr { return []netip.Addr{own} },
		Listeners: []netip.AddrPort{netip.AddrPortFrom(netip.IPv4Unspecified(), 3128)},
	})
	cases := []struct {
		policy  string
		port    uint16
		refused bool
	}{
		{`"public"`, 8080, true},
		{`{"network_mode":"allowlist","allowed_hosts":["172.18.0.0/16"]}`, 8080, true},
		{`{"network_mode":"allowlist","allowed_hosts":["0.0.0.0/0"]}`, 8080, true},
		{`{"network_mode":"allowlist","allowed_hosts":["172.18.0.2"]}`, 8080, false},
		{`{"network_mode":"allowlist","allowed_hosts":["172.18.0.0/16","172.18.0.2:8080"]}`, 8080, false},
		{`{"network_mode":"allowlist","allowed_hosts":["172.18.0.2"]}`, 3128, true},
	}
	for _, tc := range cases {
		p, err := policy.Parse([]byte(tc.policy))
		if err != nil {
			t.Fatal(err)
		}
		if got := g.Refuses(policy.Compile(p), own, tc.port); got != tc.refused {
			t.Errorf("%s port %d: refused %v, want %v", tc.policy, tc.port, got, tc.refused)
		}
	}
}

// TestGuardDenyPrivate: with --deny-private the private-use ranges are refused as
// loopback is (a rule inside the range lifts them, a broad one does not); without it
// they are ordinary addresses. The cloud endpoints inside fc00::/7 keep their own class.
func TestGuardDenyPrivate(t *testing.T) {
	plain := addrguard.New(addrguard.Config{})
	private := addrguard.New(addrguard.Config{Exempt: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}, DenyPrivate: true})
	for _, tc := range []struct {
		policy, addr   string
		plain, private bool // refused by each guard
	}{
		{`"public"`, "10.1.2.3", false, true},
		{`"public"`, "172.20.0.5", false, true},
		{`"public"`, "192.168.1.1", false, true},
		{`"public"`, "100.64.0.1", false, true},
		{`"public"`, "fd12:3456::1", false, true},
		{`"public"`, "10.255.255.254", false, true},
		{`"public"`, "172.31.255.254", false, true},
		{`"public"`, "192.168.255.254", false, true},
		{`"public"`, "100.127.255.254", false, true},
		{`"public"`, "fc00::1", false, true},
		{`"public"`, "100.128.0.1", false, false},
		{`"public"`, "203.0.113.7", false, false},
		{`"public"`, "172.32.0.1", false, false},
		{`{"network_mode":"denylist","denied_hosts":[]}`, "192.168.1.1", false, true},
		{`{"network_mode":"allowlist","allowed_hosts":["0.0.0.0/0"]}`, "10.1.2.3", false, true},
		{`{"network_mode":"allowlist","allowed_hosts":["10.0.0.0/8"]}`, "10.1.2.3", false, false},
		{`{"network_mode":"allowlist","allowed_hosts":["10.1.2.3"]}`, "10.1.2.3", false, false},
		// The operator's exempt range.
		{`"public"`, "10.9.1.1", false, false},
		// Not lifted by the unique-local range: still the AWS metadata class.
		{`{"network_mode":"allowlist","allowed_hosts":["fc00::/7"]}`, "fd00:ec2::254", true, true},
	} {
		p, err := policy.Parse([]byte(tc.policy))
		if err != nil {
			t.Fatal(err)
		}
		m := policy.Compile(p)
		a := netip.MustParseAddr(tc.addr)
		if got := plain.Refuses(m, a, 443); got != tc.plain {
			t.Errorf("without --deny-private, %s %s: refused %v, want %v", tc.policy, tc.addr, got, tc.plain)
		}
		if got := private.Refuses(m, a, 443); got != tc.private {
			t.Errorf("with --deny-private, %s %s: refused %v, want %v", tc.policy, tc.addr, got, tc.private)
		}
	}
}

// TestGuardRefusesOwnListeners: the proxy's listening endpoints are refused whatever
// exempts or lifts their address. A listener on the unspecified address is reached
// through every loopback address and every own address; one bound in the IPv4-mapped
// form is its IPv4 address.
func TestGuardRefusesOwnListeners(t *testing.T) {
	own := netip.MustParseAddr("172.18.0.2")
	// An operator exempting every local range for development.
	g := addrguard.New(addrguard.Config{
		Exempt: []netip.Prefix{
			netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"),
			netip.MustParsePrefix("0.0.0.0/32"), netip.MustParsePrefix("::/128"),
		},
		OwnAddrs: func() []netip.Addr { return []netip.Addr{own} },
		Listeners: []netip.AddrPort{
			netip.MustParseAddrPort("0.0.0.0:3128"),
			netip.MustParseAddrPort("[::ffff:198.51.100.9]:5353"),
		},
	})
	p, err := policy.Parse([]byte(`{"network_mode":"allowlist","allowed_hosts":["0.0.0.0/0","::/0","172.18.0.2","198.51.100.9"]}`))
	if err != nil {
		t.Fatal(err)
	}
	m := policy.Compile(p)
	for _, tc := range []struct {
		addr    string
		port    uint16
		refused bool
	}{
		{"127.0.0.1", 3128, true},
		{"127.0.0.5", 3128, true},
		{"::1", 3128, true},
		{"0.0.0.0", 3128, true},
		{"::", 3128, true},
		{"172.18.0.2", 3128, true},
		{"198.51.100.9", 5353, true},
		// Other ports of the same addresses: exempt or lifted.
		{"127.0.0.5", 8080, false},
		{"0.0.0.0", 8080, false},
		{"172.18.0.2", 8080, false},
		{"198.51.100.9", 3128, false},
	} {
		if got := g.Refuses(m, netip.MustParseAddr(tc.addr), tc.port); got != tc.refused {
			t.Errorf("%s port %d: refused %v, want %v", tc.addr, tc.port, got, tc.refused)
		}
	}
}
