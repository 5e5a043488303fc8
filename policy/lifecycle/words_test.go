package lifecycle

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestSplitWords(t *testing.T) {
	tests := []struct {
		in   string
		want []string
		err  string
	}{
		{"fetch http://packages.test/tool.tar", []string{"fetch", "http://packages.test/tool.tar"}, ""},
		{"  a   b\tc ", []string{"a", "b", "c"}, ""},
		{`grade --msg 'two words' "and \"more\""`, []string{"grade", "--msg", "two words", `and "more"`}, ""},
		{`a\ b ''`, []string{"a b", ""}, ""},
		{`\a b`, []string{"a", "b"}, ""},
		{"a\nb", []string{"a", "b"}, ""},
		{`x 'open`, nil, "unterminated ' quote"},
		{`x \`, nil, "lone backslash"},
		{"   ", nil, "empty command"},
	}
	for _, tc := range tests {
		got, err := splitWords(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("splitWords(%q) error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("splitWords(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// FuzzSplitWords: any line splits into words or is refused, without panicking, and a
// line of plain words splits at its blanks.
func FuzzSplitWords(f *testing.F) {
	for _, s := range []string{"a b", `'x y' "z\"" \q`, "", `a\`, "'open"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		words, err := splitWords(s)
		if err == nil && len(words) == 0 {
			t.Fatalf("splitWords(%q): no words and no error", s)
		}
		// Text that is not UTF-8 is read as runes, each bad byte becoming U+FFFD.
		if strings.ContainsAny(s, `'"\`) || !utf8.ValidString(s) {
			return
		}
		want := strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == '\t' || r == '\n' })
		if len(want) == 0 {
			if err == nil {
				t.Fatalf("splitWords(%q) = %q, want an empty command refused", s, words)
			}
		} else if err != nil || !slices.Equal(words, want) {
			t.Fatalf("splitWords(%q) = %q, %v; want %q", s, words, err, want)
		}
	})
}
