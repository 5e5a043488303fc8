package policy

import (
	"fmt"
	"strings"
	"testing"
)

// TestCanonicalHostnameIDNDots checks that the full stops IDNA maps to '.' (U+3002,
// U+FF0E, U+FF61) separate labels anywhere, the end included: a trailing one is the
// root dot, which is the same name, and two are still an empty label.
func TestCanonicalHostnameIDNDots(t *testing.T) {
	tests := []struct {
		in, want string // want "" means refused with an empty label
	}{
		{"example\u3002test", "example.test"},
		{"example.test\u3002", "example.test"},
		{"example.test\uff0e", "example.test"},
		{"example.test\uff61", "example.test"},
		{"b\u00fccher.example\u3002", "xn--bcher-kva.example"},
		{"example.test\u3002.", ""},
		{"example.test.\u3002", ""},
		{"example.test\u3002\u3002", ""},
		{"\u3002", ""},
	}
	for _, tc := range tests {
		got, err := CanonicalHostname(tc.in)
		switch {
		case tc.want == "" && (err == nil || !strings.Contains(err.Error(), "empty label")):
			t.Errorf("CanonicalHostname(%q) = %q, %v; want an empty-label error", tc.in, got, err)
		case tc.want != "" && (err != nil || got != tc.want):
			t.Errorf("CanonicalHostname(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	// A rule written with the trailing full stop is the rule without it.
	tg, err := ParseTarget("*.example.test\u3002:443")
	if err != nil || tg.String() != "*.example.test:443" {
		t.Errorf("ParseTarget(\"*.example.test\\u3002:443\") = %q, %v; want *.example.test:443", tg, err)
	}
}

// TestCanonicalHostnameLongUnicodeIsCheap checks that a long non-ASCII name is refused
// before IDNA processing, whose punycode step costs the square of the number of
// distinct characters in a label: a client of the proxy controls the host it asks for
// (up to the 64 KiB request head), and 48 KiB of distinct CJK characters took seconds.
func TestCanonicalHostnameLongUnicodeIsCheap(t *testing.T) {
	var b strings.Builder
	for i := range 16 << 10 {
		b.WriteRune(rune(0x4e00 + i))
	}
	name := b.String()
	// The length refusal, not IDNA's own error: only it comes before the conversion.
	_, err := CanonicalHostname(name)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("longer than %d bytes as written", maxUnicodeName)) {
		t.Errorf("CanonicalHostname of %d bytes: %v, want a length error", len(name), err)
	}
	// The bound is maxUnicodeName bytes: one byte more is refused for its length, the
	// bound itself goes on to IDNA (which refuses this one for its 256-character label).
	at := strings.Repeat("\U0001d41a", maxUnicodeName/4)
	for _, tc := range []struct {
		name    string
		refused bool
	}{{at, false}, {at + "a", true}} {
		_, err := CanonicalHostname(tc.name)
		if got := err != nil && strings.Contains(err.Error(), "bytes as written"); got != tc.refused {
			t.Errorf("CanonicalHostname of %d bytes: %v; want a length refusal: %v", len(tc.name), err, tc.refused)
		}
	}
	// The longest names still pass: 253 characters, each written as a 4-byte mathematical
	// letter or a 3-byte ideographic full stop.
	long := strings.Repeat(strings.Repeat("\U0001d41a", 63)+"\u3002", 3) + strings.Repeat("\U0001d41a", 61)
	want := strings.Repeat(strings.Repeat("a", 63)+".", 3) + strings.Repeat("a", 61)
	if got, err := CanonicalHostname(long); err != nil || got != want {
		t.Errorf("CanonicalHostname of a 253-character name in %d bytes = %q, %v; want %q", len(long), got, err, want)
	}
}

// TestIsNonCanonicalIPv4 pins which names an inet_aton-style parser reads as an IPv4
// address: one to four numbers, each decimal, octal (a leading 0, whose digits this
// check does not hold to 0-7: refusing "09" too fails closed) or hex with a 0x or 0X
// prefix and digits in either case. The proxy asks this of the host as the client
// wrote it, before any lower-casing.
func TestIsNonCanonicalIPv4(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"127.1", true},
		{"2130706433", true},
		{"89.1", true},
		{"0x7f.0.0.1", true},
		{"0X7F.0.0.1", true},
		{"0xFf.1", true},
		{"0x.1", true}, // "0x" with no digits reads as 0
		{"127.0.0.1.", true},
		{"1.2.3.4.5", false}, // five numbers are no address: a name
		{"1..2", false},
		{"", false},
		{"0xg.1", false},
		{"a.1", false},
		{"1.2.3.x", false},
	}
	for _, tc := range tests {
		if got := IsNonCanonicalIPv4(tc.in); got != tc.want {
			t.Errorf("IsNonCanonicalIPv4(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// TestCanonicalHostnameRefusesInvalidUTF8 checks that a requested name that is not
// valid UTF-8 is refused, as a policy entry is ("the target is not valid UTF-8"). IDNA
// reads each invalid byte sequence as U+FFFD, which it refuses when written as such, so
// without the check distinct byte strings ("\xff", "\xfe", "\xed\xa0\x80") all became
// the one made-up name "xn--zn7c", looked up and dialled though the client never
// asked for it.
func TestCanonicalHostnameRefusesInvalidUTF8(t *testing.T) {
	for _, name := range []string{"a.b\xff.example", "a.b\xfe.example", "a.b\xed\xa0\x80.example", "\xff", "b\xc0\xaf.example"} {
		if got, err := CanonicalHostname(name); err == nil {
			t.Errorf("CanonicalHostname(%q) = %q, want an error (not valid UTF-8)", name, got)
		}
	}
	// Written as the character itself, U+FFFD was already refused.
	if got, err := CanonicalHostname("a.b\ufffd.example"); err == nil {
		t.Errorf("CanonicalHostname(%q) = %q, want an error", "a.b\ufffd.example", got)
	}
}
