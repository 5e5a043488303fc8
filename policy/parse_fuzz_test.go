package policy

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// checkErrorMessage: whatever the input, an error message is valid UTF-8, has at most
// maxLines lines, and none of them is longer than 8 KiB (a line holds at most three
// clipped fragments, each at most 4x300 bytes once quoted).
func checkErrorMessage(t *testing.T, err error, maxLines int) {
	t.Helper()
	msg := err.Error()
	if !utf8.ValidString(msg) {
		t.Fatalf("error message is not valid UTF-8: %q", msg)
	}
	lines := strings.Split(msg, "\n")
	if len(lines) > maxLines {
		t.Fatalf("error message of %d lines, want at most %d", len(lines), maxLines)
	}
	for _, l := range lines {
		if len(l) > 8<<10 {
			t.Fatalf("error line of %d bytes: %.200q...", len(l), l)
		}
	}
}

// FuzzParse checks that parsing never panics and that the canonical form is a fixed point
// of parse∘print: printing a parsed policy and parsing it again gives the same policy.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		`"public"`, `"no-network"`, `{"network_mode":"public"}`,
		`{"network_mode":"allowlist","allowed_hosts":["pypi.org","registry.npmjs.org:443","*.example.com","203.0.113.10","203.0.113.0/24"]}`,
		`{"network_mode":"denylist","denied_hosts":[{"host":"registry.npmjs.org","port":443},"[2001:db8::1]:443","2001:db8::/32"]}`,
		`{"network_mode":"allowlist","allowed_hosts":["bücher.example","A.TEST.","a.test"]}`,
		"network_mode: allowlist\nallowed_hosts: [pypi.org, {host: x.test, port: 8443}]\n",
		`{"network_mode":"allowlist","allowed_hosts":["https://x","api.*.x","203.0.113.1/24"]}`,
		// Long fragments of multi-byte characters, cut in error messages.
		`{"network_mode":"allowlist","allowed_hosts":["` + strings.Repeat("é", 600) + `-",["` + strings.Repeat("😀", 300) + `"]]}`,
		`{"network_mode":"` + strings.Repeat("€", 400) + `","` + strings.Repeat("ü", 600) + `":1}`,
		// Line breaks in keys and in a YAML scalar that yaml.v3's error echoes.
		`{"network_mode":"public","` + strings.Repeat(`\n`, 250) + `x":1}`,
		"network_mode: !!bool \"" + strings.Repeat(`\n`, 250) + "\"\n",
		// Nesting at and past maxDepth, and a YAML alias bomb.
		`{"network_mode":"allowlist","allowed_hosts":` + deepJSON("[", "]", maxDepth-1, `"a.test"`) + `}`,
		deepJSON(`{"network_mode":`, "}", maxDepth+1, `"public"`),
		strings.Repeat("- ", maxDepth+1) + "public\n",
		"a: &a [x, x]\nb: &b [*a, *a]\nnetwork_mode: allowlist\nallowed_hosts: *b\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			checkErrorMessage(t, err, maxErrors+1)
			return
		}
		printed, err := json.Marshal(p)
		if err != nil {
			t.Fatalf("marshal of a parsed policy failed: %v", err)
		}
		again, err := Parse(printed)
		if err != nil {
			t.Fatalf("canonical form %s does not parse: %v", printed, err)
		}
		reprinted, _ := json.Marshal(again)
		if string(reprinted) != string(printed) {
			t.Fatalf("not a fixed point:\n%s\n%s", printed, reprinted)
		}
	})
}

// FuzzParseTarget checks the same fixed point for single targets, where most of the
// grammar lives.
func FuzzParseTarget(f *testing.F) {
	for _, seed := range []string{"pypi.org", "pypi.org:443", "*.example.com", "[2001:db8::1]:443",
		"203.0.113.0/24", "2001:db8::/32", "bücher.example", "0x7f.1", "a:b:c", "[::ffff:1.2.3.4]:80",
		"https://" + strings.Repeat("é", 160), "fe80::1%" + strings.Repeat("ü", 160)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tg, err := ParseTarget(s)
		if err != nil {
			checkErrorMessage(t, err, 1)
			return
		}
		again, err := ParseTarget(tg.String())
		if err != nil {
			t.Fatalf("canonical form %q of %q does not parse: %v", tg, s, err)
		}
		if again != tg {
			t.Fatalf("not a fixed point: %q -> %q -> %q", s, tg, again)
		}
	})
}
