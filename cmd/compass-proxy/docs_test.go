package main

import (
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestFlagTableMatchesCode: docs/proxy.md's command-line table has one row per flag,
// each with the variable parse reads and the flag's default, so the table cannot fall
// behind the code. Defaults the table writes in words
// (an empty string, a list read from resolv.conf) are matched by what they say.
func TestFlagTableMatchesCode(t *testing.T) {
	doc, err := os.ReadFile("../../docs/proxy.md")
	if err != nil {
		t.Fatal(err)
	}
	rowRE := regexp.MustCompile("(?m)^\\| `--([a-z-]+)[^`]*` \\| `([A-Z_]+)` \\| ([^|]+) \\|")
	rows := rowRE.FindAllStringSubmatch(string(doc), -1)
	var flags []*flag.Flag
	newFlagSet(&options{}).VisitAll(func(f *flag.Flag) { flags = append(flags, f) })
	docRows := map[string][]string{}
	for _, r := range rows {
		docRows[r[1]] = r
	}
	if len(rows) != len(flags) {
		t.Errorf("docs/proxy.md has %d flag rows; the code defines %d flags", len(rows), len(flags))
	}
	wordy := map[string]bool{"empty": true, "empty (off)": true, "none": true, "none (`no-network`)": true, "nameservers of `/etc/resolv.conf`": true}
	for _, f := range flags {
		r, ok := docRows[f.Name]
		if !ok {
			t.Errorf("docs/proxy.md has no row for --%s", f.Name)
			continue
		}
		if r[2] != envKey(f.Name) {
			t.Errorf("--%s: docs/proxy.md names variable %s; the code reads %s", f.Name, r[2], envKey(f.Name))
		}
		def := strings.TrimSpace(r[3])
		switch {
		case wordy[def]:
			if f.DefValue != "" {
				t.Errorf("--%s: docs/proxy.md says the default is %s; the code's is %q", f.Name, def, f.DefValue)
			}
		case strings.HasPrefix(def, "`") && strings.HasSuffix(def, "`"):
			want := strings.Trim(def, "`")
			if d, err := time.ParseDuration(want); err == nil {
				if cd, err := time.ParseDuration(f.DefValue); err != nil || cd != d {
					t.Errorf("--%s: docs/proxy.md says the default is %s; the code's is %s", f.Name, want, f.DefValue)
				}
			} else if want != f.DefValue {
				t.Errorf("--%s: docs/proxy.md says the default is %s; the code's is %s", f.Name, want, f.DefValue)
			}
		default:
			t.Errorf("--%s: docs/proxy.md's default %q is neither a `value` nor a known phrase", f.Name, def)
		}
	}
	for name := range docRows {
		if newFlagSet(&options{}).Lookup(name) == nil {
			t.Errorf("docs/proxy.md documents --%s, which the code does not define", name)
		}
	}
}
