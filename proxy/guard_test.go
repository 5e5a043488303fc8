package proxy

import (
	"fmt"
	"net/http"
	"net/netip"
	"sync"
	"testing"

	"github.com/compass-egress/compass-egress/policy"
)

func TestGuardClasses(t *testing.T) {
	g := NewGuard([]netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}, func() []netip.Addr {
		// An own address may come in the IPv4-mapped form; it is the IPv4 address.
		return []netip.Addr{netip.MustParseAddr("172.18.0.2"), netip.MustParseAddr("::ffff:172.18.0.9")}
	})
	cases := []struct {
		addr     string
		internal bool
		class    string
	}{
		{"127.0.0.1", true, "loopback"},
		{"::1", true, "loopback"},
		{"169.254.169.254", true, "link-local"},
		{"fe80::1", true, "link-local"},
		{"0.0.0.0", true, "unspecified"},
		{"::", true, "unspecified"},
		{"0.1.2.3", true, "special"},
		{"224.0.0.251", true, "multicast"},
		{"ff02::1", true, "multicast"},
		{"255.255.255.255", true, "special"},
		{"::ffff:8.8.8.8", true, "ipv4-mapped"},
		{"64:ff9b::808:808", true, "ipv4-embedding"},
		{"64:ff9b:1::1", true, "ipv4-embedding"},
		{"2002:808:808::1", true, "ipv4-embedding"},
		{"2001:0:1::1", true, "ipv4-embedding"},
		{"::8.8.8.8", true, "ipv4-embedding"},
		{"::ffff:0:808:808", true, "ipv4-embedding"},
		{"100.100.100.200", true, "special"},
		{"168.63.129.16", true, "special"},
		{"168.63.129.17", false, ""},
		{"fd00:ec2::254", true, "special"},
		{"fd00:ec2::23", true, "special"},
		{"fd20:ce::254", true, "special"},
		{"fd20:ce::1", false, ""},
		{"172.18.0.2", true, "proxy-own-address"},
		{"172.18.0.9", true, "proxy-own-address"},
		// The far end of each range, so that no range is narrower than it should be:
		// an IPv4-embedding form of the metadata address (169.254.169.254 is a9fe:a9fe)
		// lies in the upper half of its range.
		{"127.255.255.254", true, "loopback"},
		{"169.254.255.254", true, "link-local"},
		{"febf:ffff::1", true, "link-local"},
		{"239.255.255.250", true, "multicast"},
		{"ffff::1", true, "multicast"},
		{"0.255.255.255", true, "special"},
		{"64:ff9b::a9fe:a9fe", true, "ipv4-embedding"},
		{"64:ff9b:1:ffff::1", true, "ipv4-embedding"},
		{"2002:a9fe:a9fe::1", true, "ipv4-embedding"},
		{"2001:0:ffff::1", true, "ipv4-embedding"},
		{"::a9fe:a9fe", true, "ipv4-embedding"},
		{"::ffff:0:a9fe:a9fe", true, "ipv4-embedding"},
		{"198.51.100.7", false, ""},
		{"2001:db8::1", false, ""},
		{"10.9.1.1", false, ""},
	}
	for _, tc := range cases {
		internal, class := g.Internal(netip.MustParseAddr(tc.addr))
		if internal != tc.internal || class != tc.class {
			t.Errorf("%s: %v %q, want %v %q", tc.addr, internal, class, tc.internal, tc.class)
		}
	}
	if !g.Exempt(netip.MustParseAddr("10.9.1.1")) || g.Exempt(netip.MustParseAddr("10.8.1.1")) {
		t.Error("exempt ranges")
	}
}

// TestGuardSeesNewOwnAddresses: a network attached after start adds an own address.
func TestGuardSeesNewOwnAddresses(t *testing.T) {
	var mu sync.Mutex
	own := []netip.Addr{netip.MustParseAddr("172.18.0.2")}
	g := NewGuard(nil, func() []netip.Addr { mu.Lock(); defer mu.Unlock(); return own })
	late := netip.MustParseAddr("172.30.0.3")
	if in, _ := g.Internal(late); in {
		t.Fatal("not yet an own address")
	}
	mu.Lock()
	own = append(own, late)
	mu.Unlock()
	g.every = 0
	if in, class := g.Internal(late); !in || class != "proxy-own-address" {
		t.Fatalf("late address: %v %q", in, class)
	}
}

func TestSplitAuthority(t *testing.T) {
	cases := []struct {
		in     string
		def    uint16
		host   string
		port   uint16
		reason string
	}{
		{"a.test", 80, "a.test", 80, ""},
		{"a.test:8080", 80, "a.test", 8080, ""},
		{"a.test:", 80, "a.test", 80, ""},
		{"a.test", 0, "", 0, ReasonInvalidPort},
		{"a.test:0", 0, "", 0, ReasonInvalidPort},
		{"a.test:65536", 0, "", 0, ReasonInvalidPort},
		{"a.test:+80", 0, "", 0, ReasonInvalidPort},
		{"a.test:080", 0, "", 0, ReasonInvalidPort},
		{"[2001:db8::1]:0443", 0, "", 0, ReasonInvalidPort},
		{"[2001:db8::1]:443", 0, "2001:db8::1", 443, ""},
		{"[2001:db8::1]", 80, "2001:db8::1", 80, ""},
		{"2001:db8::1", 80, "", 0, ReasonInvalidHost},
		{"[a.test]:80", 0, "", 0, ReasonInvalidHost},
		{"[::1]x", 0, "", 0, ReasonInvalidHost},
		{"[::1", 0, "", 0, ReasonInvalidHost},
		{"[127.0.0.1]:80", 0, "", 0, ReasonInvalidHost},
	}
	for _, tc := range cases {
		host, port, reason := splitAuthority(tc.in, tc.def)
		if host != tc.host || port != tc.port || reason != tc.reason {
			t.Errorf("%q: %q %d %q, want %q %d %q", tc.in, host, port, reason, tc.host, tc.port, tc.reason)
		}
	}
}

// TestSameAuthority: a Host field names the URI's destination only with the same
// canonical name or the same address, and the same port when it has one.
func TestSameAuthority(t *testing.T) {
	cases := []struct {
		field, uri string
		def        uint16
		same       bool
	}{
		{"a.test", "a.test:8080", 80, true},
		{"A.Test.", "a.test", 80, true},
		{"a.test:8080", "a.test:8080", 80, true},
		{"a.test:80", "a.test", 80, true},
		{"a.test:81", "a.test", 80, false},
		{"b.test", "a.test", 80, false},
		{"b.test", "a.test:8080", 80, false},
		{"127.0.0.3", "a.test", 80, false},
		{"a.test", "127.0.0.3", 80, false},
		{"127.0.0.3", "127.0.0.2", 80, false},
		{"127.0.0.2", "127.0.0.2", 80, true},
		{"[::ffff:127.0.0.2]", "127.0.0.2", 80, true},
		{"[2001:db8::1]:443", "[2001:db8::1]", 443, true},
		{"[2001:db8::2]", "[2001:db8::1]", 443, false},
		{"", "a.test", 80, false},
		{"a.test:0443", "a.test", 443, false},
	}
	for _, tc := range cases {
		if got := sameAuthority(tc.field, tc.uri, tc.def); got != tc.same {
			t.Errorf("Host %q, URI authority %q: same %v, want %v", tc.field, tc.uri, got, tc.same)
		}
	}
}

// Internal reports whether addr is an internal address and, if so, which class.
func (g *Guard) Internal(addr netip.Addr) (bool, string) {
	c, ok := g.classify(addr)
	return ok, c.Name
}

// TestGuardRefusesSpecialAddresses: the cloud endpoints outside the link-local ranges
// are refused in every mode, also when a broad rule allows them; only a rule naming one
// lifts it. IPv6 reaches the metadata and credential endpoints outside fe80::/10 (the
// unique-local range fc00::/7 covers them); Azure's WireServer (168.63.129.16), which a
// VM reaches for its goal state, extension settings and certificates, lies outside every
// private range, so only its own class keeps a name that resolves to it (a denylist, a
// rebinding wildcard) or a broad rule from reaching it.
func TestGuardRefusesSpecialAddresses(t *testing.T) {
	g := NewGuard(nil, func() []netip.Addr { return nil })
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
// addresses opens it (SPEC §7); a range around it does not, nor does any rule open the
// proxy's own listeners there.
func TestGuardOwnAddressLiftedOnlyByItsRule(t *testing.T) {
	own := netip.MustParseAddr("172.18.0.2")
	g := NewGuard(nil, func() []netip.Addr { return []netip.Addr{own} })
	g.setListeners([]netip.AddrPort{netip.AddrPortFrom(netip.IPv4Unspecified(), 3128)})
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
	plain := NewGuard(nil, func() []netip.Addr { return nil })
	private := NewGuard([]netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}, func() []netip.Addr { return nil })
	private.DenyPrivate()
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

// The server's guard refuses a private address only with Config.DenyPrivate; without
// it the dial is tried (and the harness refuses it, being outside loopback).
func TestServerDenyPrivate(t *testing.T) {
	for _, deny := range []bool{false, true} {
		t.Run(fmt.Sprintf("DenyPrivate=%v", deny), func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.DenyPrivate = deny })
			h.dns.set("lan.test", netip.MustParseAddr("10.1.2.3"))
			h.apply(`{"network_mode":"denylist","denied_hosts":[]}`)
			status, header := h.connectStatus("lan.test:443")
			if deny {
				checkOutcome(t, "CONNECT lan.test:443", status, header, ReasonInternalAddress)
			} else if status != http.StatusBadGateway || header != "error; reason=dial-failed" {
				t.Errorf("CONNECT lan.test:443: %d %q, want the dial tried (502 dial-failed)", status, header)
			}
		})
	}
}

// TestGuardRefusesOwnListeners: the proxy's listening endpoints are refused whatever
// exempts or lifts their address. A listener on the unspecified address is reached
// through every loopback address and every own address; one bound in the IPv4-mapped
// form is its IPv4 address.
func TestGuardRefusesOwnListeners(t *testing.T) {
	own := netip.MustParseAddr("172.18.0.2")
	// An operator exempting every local range for development.
	g := NewGuard([]netip.Prefix{
		netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"),
		netip.MustParsePrefix("0.0.0.0/32"), netip.MustParsePrefix("::/128"),
	}, func() []netip.Addr { return []netip.Addr{own} })
	g.setListeners([]netip.AddrPort{
		netip.MustParseAddrPort("0.0.0.0:3128"),
		netip.MustParseAddrPort("[::ffff:198.51.100.9]:5353"),
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
