package proxy

import "testing"

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
