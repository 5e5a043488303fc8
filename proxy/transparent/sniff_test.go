package transparent

import (
	"testing"
)

func TestMethodPrefix(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"GET / HTTP/1.1", isMethod},
		{"POST ", isMethod},
		{"OPTIONS *", isMethod},
		{"G", maybeMethod},
		{"CONNEC", maybeMethod},
		{"GET", maybeMethod},
		{"GETX ", notMethod},
		{"get / ", notMethod},
		{"SSH-2.0-", notMethod},
		{"EHLO a.", notMethod},
		{"SET k v", notMethod},
		{"PING\r\n", notMethod},
		{"\x16\x03\x01", notMethod},
	} {
		if got := methodPrefix([]byte(tc.in)); got != tc.want {
			t.Errorf("methodPrefix(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// FuzzMethodPrefix: a prefix of a method-and-space stream is never refused, and an
// answer of isMethod always names a method followed by a space.
func FuzzMethodPrefix(f *testing.F) {
	for _, s := range []string{"GET / HTTP/1.1", "PATCH", "SSH-2.0-x", "", "\x16\x03"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		if len(p) > peekLen {
			p = p[:peekLen]
		}
		got := methodPrefix(p)
		if got == isMethod {
			ok := false
			for _, m := range methods {
				ok = ok || len(p) > len(m) && string(p[:len(m)+1]) == m+" "
			}
			if !ok {
				t.Fatalf("%q read as a method", p)
			}
		}
		for _, m := range methods {
			full := m + " "
			if len(p) > 0 && len(p) <= len(full) && string(p) == full[:len(p)] && got == notMethod {
				t.Fatalf("%q, a prefix of %q, refused", p, full)
			}
		}
	})
}
