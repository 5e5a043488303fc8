package policy

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// deepJSON is open nested n times around inner, closed again: deepJSON("[", "]", 2, "1")
// is [[1]].
func deepJSON(open, close string, n int, inner string) string {
	return strings.Repeat(open, n) + inner + strings.Repeat(close, n)
}

// TestDecodeRefusesDeepNesting is the regression test for a 2 MiB policy of 2^20 nested
// lists, which crashed the process (a fatal stack overflow, not a panic) on its way to
// an error message. Every depth past maxDepth is refused with an error naming the limit;
// maxDepth itself still decodes.
func TestDecodeRefusesDeepNesting(t *testing.T) {
	const huge = 1 << 20
	tooDeep := fmt.Sprintf("nesting deeper than %d levels", maxDepth)
	tests := []struct {
		name string
		doc  string
		want string // a fragment of the error; empty when the document decodes
	}{
		{"JSON lists at the limit", deepJSON("[", "]", maxDepth, ""), ""},
		{"JSON objects at the limit", deepJSON(`{"a":`, "}", maxDepth, "1"), ""},
		{"JSON lists one past the limit", deepJSON("[", "]", maxDepth+1, ""), "invalid JSON: byte offset 32: " + tooDeep},
		{"JSON objects one past the limit", deepJSON(`{"a":`, "}", maxDepth+1, "1"), "invalid JSON: byte offset 160: " + tooDeep},
		{"JSON 2^20 lists", deepJSON("[", "]", huge, ""), tooDeep},
		{"JSON 2^20 objects", deepJSON(`{"a":`, "}", huge, "null"), tooDeep},
		{"JSON 2^20 lists unclosed", strings.Repeat("[", huge), tooDeep},
		{"JSON 2^20 lists in a policy", `{"network_mode":"allowlist","allowed_hosts":` + deepJSON("[", "]", huge, `"a.test"`) + "}", tooDeep},
		{"YAML block lists at the limit", strings.Repeat("- ", maxDepth) + "x\n", ""},
		{"YAML block lists one past the limit", strings.Repeat("- ", maxDepth+1) + "x\n", "invalid YAML: line 1: " + tooDeep},
		{"YAML mappings one past the limit", deepYAMLMapping(maxDepth + 1), fmt.Sprintf("invalid YAML: line %d: %s", maxDepth+1, tooDeep)},
		{"YAML flow lists one past the limit", "x: " + deepJSON("[", "]", maxDepth, ""), "invalid YAML: line 1: " + tooDeep},
		// yaml.v3 refuses more than 10000 levels itself, before building the tree.
		// Past yaml.v3's own depth limit yet within maxYAMLBytes (2^20 levels are refused by size).
		{"YAML 2^17 flow lists", "x: " + deepJSON("[", "]", huge>>3, ""), "invalid YAML: yaml: exceeded max depth of 10000"},
		{"YAML 2^16 flow mappings", "x: " + deepJSON("{a: ", "}", huge>>4, "1"), "invalid YAML: yaml: exceeded max depth of 10000"},
		{"YAML 2^18 block lists", strings.Repeat("- ", huge>>2) + "x\n", "invalid YAML: yaml: exceeded max depth of 10000"},
		{"YAML 9999 block lists", strings.Repeat("- ", 9999) + "x\n", "invalid YAML: line 1: " + tooDeep},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeDocument([]byte(tc.doc))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("DecodeDocument: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("DecodeDocument error = %v, want it to contain %q", err, tc.want)
			}
			// The paths that took the crash: a policy (the proxy's admin API and reload,
			// compassctl) and env params.
			if _, err := Parse([]byte(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse error = %v, want it to contain %q", err, tc.want)
			}
			if _, err := ParseEnvParams([]byte(tc.doc)); err == nil {
				t.Fatal("ParseEnvParams accepted the document")
			}
		})
	}
}

// deepYAMLMapping nests n block mappings, one per line: "a:\n  a:\n ... a: 1".
func deepYAMLMapping(n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteString(strings.Repeat("  ", i))
		if i == n-1 {
			b.WriteString("a: 1\n")
		} else {
			b.WriteString("a:\n")
		}
	}
	return b.String()
}

// TestDecodeYAMLRefusesAliasBombs: an alias bomb ("billion laughs") is a small document
// whose aliases would expand to 10^10 strings. yaml.v3 does not expand aliases when it builds a
// yaml.Node tree, and the decoder refuses any alias, so none is ever followed.
func TestDecodeYAMLRefusesAliasBombs(t *testing.T) {
	var bomb strings.Builder
	bomb.WriteString("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
	for i := 1; i < 10; i++ {
		fmt.Fprintf(&bomb, "a%d: &a%d [", i, i)
		for j := 0; j < 10; j++ {
			if j > 0 {
				bomb.WriteString(", ")
			}
			fmt.Fprintf(&bomb, "*a%d", i-1)
		}
		bomb.WriteString("]\n")
	}
	tests := []struct{ name, doc, want string }{
		{"billion laughs", bomb.String(), "invalid YAML: line 2: aliases are not supported"},
		{"billion laughs as a policy", bomb.String() + "network_mode: allowlist\nallowed_hosts: *a9\n", "invalid YAML: line 2: aliases are not supported"},
		// The merge key is refused as a key before its alias is looked at.
		{"merge keys", "base: &b {network_mode: public}\npolicy:\n  <<: *b\n", "invalid YAML: line 3: keys must be strings"},
		{"alias to itself", "a: &a [*a]\n", "aliases are not supported"},
		{"undefined alias", "a: *nowhere\n", `invalid YAML: yaml: unknown anchor 'nowhere' referenced`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := DecodeYAML([]byte(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("DecodeYAML error = %v, want it to contain %q", err, tc.want)
			}
			if _, err := Parse([]byte(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestDisplayIsBounded: display renders at most 80 characters whatever the value's
// size or depth, so an error message about a huge or deep value (built by hand here, past
// anything the decoders return) costs little and cannot crash.
func TestDisplayIsBounded(t *testing.T) {
	deep := any("x")
	for i := 0; i < 1<<20; i++ {
		deep = []any{deep}
	}
	deepObj := any(nil)
	for i := 0; i < 1<<20; i++ {
		deepObj = map[string]any{"a": deepObj}
	}
	flat := make([]any, 1<<20)
	for i := range flat {
		flat[i] = json.Number("1234567")
	}
	wide := make(map[string]any, 1<<16)
	for i := 0; i < 1<<16; i++ {
		wide[fmt.Sprintf("k%06d", i)] = true
	}
	tests := []struct {
		name string
		v    any
		want string
	}{
		{"deep lists", deep, strings.Repeat("[", 77) + "..."},
		{"deep objects", deepObj, strings.Repeat(`{"a":`, 15) + `{"...`},
		{"flat list", flat, "[" + strings.Repeat("1234567,", 9) + "1234..."},
		{"wide object", wide, `{"k000000":true,"k000001":true,"k000002":true,"k000003":true,"k000004":true,"...`},
		// The cut falls inside the 38th "é" (bytes 76 and 77): it moves back to byte 76
		// rather than split it, so the message stays valid UTF-8.
		{"long string in a list", []any{strings.Repeat("é", 1<<20)}, `["` + strings.Repeat("é", 37) + "..."},
		{"long 4-byte string in a list", []any{strings.Repeat("😀", 1<<10)}, `["` + strings.Repeat("😀", 18) + "..."},
		{"long key", map[string]any{"k" + strings.Repeat("€", 1<<10): true}, `{"k` + strings.Repeat("€", 24) + "..."},
		{"long number in a list", []any{json.Number(strings.Repeat("9", 1<<20))}, "[" + strings.Repeat("9", 76) + "..."},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := display(tc.v)
			if got != tc.want {
				t.Fatalf("display = %q (%d bytes), want %q", got, len(got), tc.want)
			}
			if !utf8.ValidString(got) || len(got) > displayMax {
				t.Fatalf("display = %q (%d bytes): invalid UTF-8 or longer than %d bytes", got, len(got), displayMax)
			}
		})
	}

	// The paths that show such values: a policy, a network mode and a task that are not
	// what they should be.
	_, err := ParseValue(deep, "run_network_policy")
	want := "run_network_policy " + strings.Repeat("[", 77) + `...: a policy is a string ("public", "no-network") or an object, not a list`
	if err == nil || err.Error() != want {
		t.Fatalf("ParseValue error = %v, want %s", err, want)
	}
	_, err = ParseValue(map[string]any{"network_mode": flat}, "")
	want = "network_mode [" + strings.Repeat("1234567,", 9) + "1234...: unknown network mode; use one of public, no-network, allowlist, denylist"
	if err == nil || err.Error() != want {
		t.Fatalf("ParseValue error = %v, want %s", err, want)
	}
	_, err = ParseTasks([]any{deep}, "tasks.json")
	want = "[0] " + strings.Repeat("[", 77) + "...: a task is an object, not a list"
	if err == nil || err.Error() != want {
		t.Fatalf("ParseTasks error = %v, want %s", err, want)
	}
}

// TestDisplayMatchesJSON: for values the decoders return, display is the value's JSON
// (as encoding/json writes it: keys sorted, HTML characters escaped), cut to 80
// characters, as it was when display marshalled the whole value; strings alone are
// quoted Go-style.
func TestDisplayMatchesJSON(t *testing.T) {
	docs := []string{
		`null`, `true`, `false`, `0`, `-1.5e300`, `[]`, `{}`, `[[],{}]`, `"a\"b"`, `"<&>"`,
		`[1,"two",true,null,{"b":[2],"a":{}}]`,
		`{"z":1,"a":"\u2028<script>&amp;</script>","m":["\u00e9\ud83d\ude00\u0007\t\n"]}`,
		`{"network_mode":"allowlist","allowed_hosts":["a.test","b.test","c.test","d.test","e.test","f.test"]}`,
		`["` + strings.Repeat("x", 75) + `"]`, `["` + strings.Repeat("x", 76) + `"]`, `["` + strings.Repeat("x", 77) + `"]`,
		`["` + strings.Repeat("x", 74) + `é"]`, `["` + strings.Repeat("x", 75) + `é"]`, `["` + strings.Repeat("x", 76) + `é"]`,
		`["` + strings.Repeat("x", 70) + `<<<<"]`, `[` + strings.Repeat("1", 78) + `]`, `[` + strings.Repeat("1", 79) + `]`,
		deepJSON("[", "]", 32, ""), deepJSON(`{"a":`, "}", 32, `"x"`),
	}
	for _, doc := range docs {
		v, err := DecodeJSON([]byte(doc))
		if err != nil {
			t.Fatalf("DecodeJSON(%s): %v", doc, err)
		}
		if got, want := display(v), marshalledDisplay(v); got != want {
			t.Errorf("display(%s) = %s, want %s", doc, got, want)
		}
	}
	// Invalid UTF-8 (possible in YAML) becomes U+FFFD, as encoding/json writes it.
	for _, v := range []any{[]any{"a\xffb"}, []any{strings.Repeat("x", 76) + "\xff\xfe"}, map[string]any{"\xff": "\xc3"}} {
		if got, want := display(v), marshalledDisplay(v); got != want {
			t.Errorf("display(%q) = %s, want %s", v, got, want)
		}
	}
	// YAML numbers that are not JSON numbers (hex, octal, .inf) show as written.
	v, err := DecodeYAML([]byte("{a: 0x1F, b: [0o17, .inf, 1_000]}"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := display(v), `{"a":0x1F,"b":[0o17,.inf,1_000]}`; got != want {
		t.Errorf("display = %s, want %s", got, want)
	}
}

// marshalledDisplay is display as it was: the whole value marshalled, then cut (at a
// character boundary, since a cut inside a character wrote invalid UTF-8).
func marshalledDisplay(v any) string {
	if s, ok := v.(string); ok {
		return fmt.Sprintf("%q", s)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if len(b) > 80 {
		// Cut at the last character boundary at or before byte 77, never inside one.
		cut := 77
		for !utf8.RuneStart(b[cut]) {
			cut--
		}
		return string(b[:cut]) + "..."
	}
	return string(b)
}

// A JSON document of small values cost about a microsecond and 200 bytes each to decode:
// a 32 MiB admin request of 16 million numbers took 16 s and 3.5 GB. The decoder stops
// at its bound instead, naming it; the bound counts every list, object and scalar.
func TestDecodeJSONRefusesTooManyValues(t *testing.T) {
	tests := []struct {
		doc  string
		want string // a fragment of the error; empty when the document decodes
	}{
		{`[1,2,3,4]`, ""},
		{`{"a":[1,2],"b":null}`, ""},
		{`[1,2,3,4,5]`, "invalid JSON: byte offset 10: more than 5 values in one document"},
		{`{"a":[1,2],"b":{"c":1}}`, "more than 5 values"},
		{`[[[[[[]]]]]]`, "more than 5 values"},
		{"[" + strings.Repeat("0,", 1<<20) + "0]", "invalid JSON: byte offset 10: more than 5 values in one document"},
	}
	for _, tc := range tests {
		_, err := decodeJSON([]byte(tc.doc), 5)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%.40s: %v", tc.doc, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%.40s: error %v, want %q", tc.doc, err, tc.want)
		}
	}
	if maxValues < 1_000_000 {
		t.Errorf("maxValues %d leaves no room for the million-value allowlists it is meant to admit", maxValues)
	}
}

// yaml.v3 builds a node tree of about 150 bytes per input byte before anything can count
// values, so YAML is bounded by size: a 32 MiB list took 20 s and 4.7 GB.
func TestDecodeYAMLRefusesLargeDocuments(t *testing.T) {
	pad := func(n int) []byte {
		doc := []byte("network_mode: public\n#")
		doc = append(doc, strings.Repeat("x", n-len(doc)-1)...)
		return append(doc, '\n')
	}
	if _, err := DecodeYAML(pad(maxYAMLBytes)); err != nil {
		t.Fatalf("a document of exactly %d bytes: %v", maxYAMLBytes, err)
	}
	want := fmt.Sprintf("invalid YAML: %d bytes: a YAML document may hold at most %d; write a larger one as JSON", maxYAMLBytes+1, maxYAMLBytes)
	if _, err := DecodeYAML(pad(maxYAMLBytes + 1)); err == nil || err.Error() != want {
		t.Fatalf("a document of %d bytes: %v, want %q", maxYAMLBytes+1, err, want)
	}
	if _, err := DecodeDocument(pad(maxYAMLBytes + 1)); err == nil || err.Error() != want {
		t.Fatalf("DecodeDocument: %v", err)
	}
}

// A JSON document with a UTF-8 byte order mark (some editors write one) used to go to
// the YAML decoder, which read it; past 1 MiB that is refused as YAML. The mark is
// skipped and the document decoded as the JSON it is.
func TestDecodeDocumentSkipsAByteOrderMark(t *testing.T) {
	doc := "\ufeff" + `{"network_mode":"allowlist","allowed_hosts":["` + strings.Repeat(`a.test","`, 130_000) + `b.test"]}`
	if len(doc) <= maxYAMLBytes {
		t.Fatalf("the document (%d bytes) must be larger than maxYAMLBytes", len(doc))
	}
	v, err := DecodeDocument([]byte(doc))
	if err != nil {
		t.Fatalf("a %d-byte JSON document with a BOM: %v", len(doc), err)
	}
	if hosts := v.(map[string]any)["allowed_hosts"].([]any); len(hosts) != 130_001 {
		t.Fatalf("%d hosts", len(hosts))
	}
	if _, err := DecodeDocument([]byte("\ufeffnetwork_mode: public\n")); err != nil {
		t.Fatalf("YAML with a BOM: %v", err)
	}
}
