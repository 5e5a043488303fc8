package procnet

import (
	"net/netip"
	"os"
	"slices"
	"testing"
)

// The parsers read the kernel's own files (testdata: copied from a machine, plus a route
// through a second gateway on each family).
func TestParseRouteGateways(t *testing.T) {
	for _, tc := range []struct {
		file  string
		parse func([]byte) []netip.Addr
		want  []string
	}{
		{"testdata/proc_net_route", parseIPv4RouteGateways, []string{"192.0.2.1", "10.0.0.1"}},
		{"testdata/proc_net_ipv6_route", parseIPv6RouteGateways, []string{"fd00::1", "fe80::1"}},
	} {
		b, err := os.ReadFile(tc.file)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, a := range tc.parse(b) {
			got = append(got, a.String())
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: gateways %v, want %v", tc.file, got, tc.want)
		}
	}
}

func FuzzParseRouteGateways(f *testing.F) {
	for _, name := range []string{"testdata/proc_net_route", "testdata/proc_net_ipv6_route"} {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("h\nx 0 zzzzzzzz 3\n"))
	// A line cut short, and gateway routes through the unspecified address.
	f.Add([]byte("h\nx 0 0100000A\n"))
	f.Add([]byte("h\nx 0 00000000 3\n"))
	f.Add([]byte("00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 00000400 00000001 00000000 00000003 eth0\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, a := range parseIPv4RouteGateways(b) {
			if !a.Is4() || a.IsUnspecified() {
				t.Errorf("IPv4 gateway %v", a)
			}
		}
		for _, a := range parseIPv6RouteGateways(b) {
			if !a.Is6() || a.IsUnspecified() {
				t.Errorf("IPv6 gateway %v", a)
			}
		}
	})
}
