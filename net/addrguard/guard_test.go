package addrguard

import (
	"net/netip"
	"sync"
	"testing"
)

func TestGuardClasses(t *testing.T) {
	g := New(Config{Exempt: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}, OwnAddrs: func() []netip.Addr {
		// An own address may come in the IPv4-mapped form; it is the IPv4 address.
		return []netip.Addr{netip.MustParseAddr("172.18.0.2"), netip.MustParseAddr("::ffff:172.18.0.9")}
	}})
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
		c, internal := g.classify(netip.MustParseAddr(tc.addr))
		if internal != tc.internal || c.Name != tc.class {
			t.Errorf("%s: %v %q, want %v %q", tc.addr, internal, c.Name, tc.internal, tc.class)
		}
	}
	if !g.exempts(netip.MustParseAddr("10.9.1.1")) || g.exempts(netip.MustParseAddr("10.8.1.1")) {
		t.Error("exempt ranges")
	}
}

// TestGuardSeesNewOwnAddresses: a network attached after start adds an own address.
func TestGuardSeesNewOwnAddresses(t *testing.T) {
	var mu sync.Mutex
	own := []netip.Addr{netip.MustParseAddr("172.18.0.2")}
	g := New(Config{OwnAddrs: func() []netip.Addr { mu.Lock(); defer mu.Unlock(); return own }})
	late := netip.MustParseAddr("172.30.0.3")
	if _, in := g.classify(late); in {
		t.Fatal("not yet an own address")
	}
	mu.Lock()
	own = append(own, late)
	mu.Unlock()
	g.every = 0
	if c, in := g.classify(late); !in || c.Name != "proxy-own-address" {
		t.Fatalf("late address: %v %q", in, c.Name)
	}
}
