package dnsaddr

import (
	"net/netip"
	"testing"
)

// --dns-upstream takes an IP address with an optional port, 53 by default; a name, or
// port 0, is refused.
func TestParseUpstream(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"10.0.0.2", "10.0.0.2:53"},
		{"10.0.0.2:5353", "10.0.0.2:5353"},
		{"fd00::2", "[fd00::2]:53"},
		{"[fd00::2]", "[fd00::2]:53"},
		{"[fd00::2]:5353", "[fd00::2]:5353"},
		{"10.0.0.2:0", ""},
		{"[fd00::2]:0", ""},
		{"dns.test", ""},
		{"dns.test:53", ""},
	} {
		got, err := ParseUpstream(tc.in)
		if got != tc.want || (err != nil) != (tc.want == "") {
			t.Errorf("ParseUpstream(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// FuzzParseUpstream: whatever it is given, ParseUpstream either refuses it or returns an
// address with a port that reads back as itself, so the DNS client dials what was meant.
func FuzzParseUpstream(f *testing.F) {
	for _, s := range []string{"10.0.0.2", "10.0.0.2:53", "[fd00::2]:5353", "fd00::2", "[fd00::2]", "dns.test", ":53", "[::1]:0", "fe80::1%eth0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseUpstream(s)
		if err != nil {
			if got != "" {
				t.Fatalf("ParseUpstream(%q) = %q with error %v", s, got, err)
			}
			return
		}
		ap, perr := netip.ParseAddrPort(got)
		if perr != nil || ap.Port() == 0 || ap.String() != got {
			t.Fatalf("ParseUpstream(%q) = %q, not a canonical ip:port (%v)", s, got, perr)
		}
		if again, err := ParseUpstream(got); err != nil || again != got {
			t.Fatalf("ParseUpstream(%q) = %q, but that reads back as %q, %v", s, got, again, err)
		}
	})
}
