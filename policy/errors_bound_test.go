package policy

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestEscapeUnprintable(t *testing.T) {
	for in, want := range map[string]string{
		"a.test":          "a.test",
		"bücher.test":     "bücher.test",
		"a\nb\tc\x00":     `a\nb\tc\x00`,
		"a\u2028b\u2029":  `a\u2028b\u2029`,
		"!\xc0\x80":       `!\xc0\x80`,
		"é\xe2\x82":       `é\xe2\x82`, // a character cut short
		"\x7f\u0085":      `\x7f\u0085`,
		"\uFFFD is valid": "\uFFFD is valid",
	} {
		if got := escapeUnprintable(in); got != want {
			t.Errorf("escapeUnprintable(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestClip: a fragment of up to fragmentMax bytes is shown whole, a longer one is cut at
// a character boundary at or before fragmentMax and says how many bytes it left out.
func TestClip(t *testing.T) {
	tests := []struct {
		name, in, head string // head: the part of in that clip keeps
	}{
		{"empty", "", ""},
		{"at the bound", strings.Repeat("a", fragmentMax), strings.Repeat("a", fragmentMax)},
		{"one past the bound", strings.Repeat("a", fragmentMax+1), strings.Repeat("a", fragmentMax)},
		{"2-byte character across the cut", "a" + strings.Repeat("é", fragmentMax), "a" + strings.Repeat("é", (fragmentMax-1)/2)},
		{"3-byte characters ending at the cut", strings.Repeat("€", fragmentMax), strings.Repeat("€", fragmentMax/3)},
		{"4-byte character across the cut", strings.Repeat("😀", fragmentMax), strings.Repeat("😀", fragmentMax/4)},
		{"4-byte character starting at the cut", strings.Repeat("a", fragmentMax) + "😀", strings.Repeat("a", fragmentMax)},
		// Invalid UTF-8 has no boundary: the cut moves back at most 3 bytes.
		{"continuation bytes only", strings.Repeat("\x80", fragmentMax+10), strings.Repeat("\x80", fragmentMax-3)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var more string
			if n := len(tc.in) - len(tc.head); n > 0 {
				more = "…(" + strconv.Itoa(n) + " more bytes)"
			}
			if got, want := Clip(tc.in), escapeUnprintable(tc.head)+more; got != want {
				t.Errorf("clip = %q, want %q", got, want)
			}
			if !utf8.ValidString(Clip(tc.in)) {
				t.Errorf("clip is not valid UTF-8: %q", Clip(tc.in))
			}
			if got, want := Quote(tc.in), strconv.Quote(tc.head)+more; got != want {
				t.Errorf("quote = %q, want %q", got, want)
			}
			if utf8.ValidString(tc.in) && !utf8.ValidString(Clip(tc.in)) {
				t.Errorf("clip of valid UTF-8 is not valid UTF-8: %q", Clip(tc.in))
			}
		})
	}
}

// TestErrorMessagesAreBounded is the regression test for error messages that quoted
// user text in full: the proxy's admin API takes a 32 MiB body, and a body that is one
// 32 MiB string came back (and was logged) as a 32 MiB error message. Every message here
// stays under 4 KiB, is valid UTF-8, and still names the field and the rule broken.
func TestErrorMessagesAreBounded(t *testing.T) {
	const mib = 1 << 20
	big := strings.Repeat("a", mib)
	bigE := strings.Repeat("é", mib/2) // cut inside a character unless clip takes care
	// YAML documents may hold at most maxYAMLBytes (1 MiB), so theirs are half as big.
	half, halfE := big[:mib/2], bigE[:mib/2]
	parse := func(doc string) func() error {
		return func() error { _, err := Parse([]byte(doc)); return err }
	}
	tests := []struct {
		name string
		run  func() error
		want []string // fragments of the message, in order
	}{
		{"32 MiB string body", parse(`"` + strings.Repeat("a", 32*mib) + `"`),
			[]string{`policy "aaaa`, `a"…(33553408 more bytes): unknown network mode`}},
		{"32 MiB string body of 2-byte characters", parse(`"` + strings.Repeat("é", 16*mib) + `"`),
			[]string{`policy "éé`, `é"…(33553408 more bytes): unknown network mode`}},
		{"1 MiB key", parse(`{"network_mode":"public","` + big + `":1}`),
			[]string{"aaaa", "a…(1047552 more bytes): unknown key; a policy object takes only"}},
		{"1 MiB key in a target object", parse(`{"network_mode":"allowlist","allowed_hosts":[{"host":"a.test","` + big + `":1}]}`),
			[]string{"allowed_hosts[0].aaaa", "a…(1047552 more bytes): unknown key; a target object takes only host and port"}},
		{"1 MiB host entry in allowed_hosts", parse(`{"network_mode":"allowlist","allowed_hosts":["a.test","` + big + `"]}`),
			[]string{`allowed_hosts[1] "aaaa`, `a"…(1047552 more bytes): the host name is longer than 253 characters`}},
		{"1 MiB host in a target object", parse(`{"network_mode":"allowlist","allowed_hosts":[{"host":"` + bigE + `"}]}`),
			[]string{`allowed_hosts[0].host "éé`, `é"…(1047552 more bytes): `}},
		{"1 MiB host of a URL", parse(`{"network_mode":"denylist","denied_hosts":["https://` + big + `/x"]}`),
			[]string{`denied_hosts[0] "https://aaaa`, `a"…(1047562 more bytes): a URL scheme is not allowed: write the host alone, e.g. "aaaa`, `a"…(1047552 more bytes)`}},
		{"1 MiB port", parse(`{"network_mode":"allowlist","allowed_hosts":["a.test:` + strings.Repeat("9", mib) + `"]}`),
			[]string{`allowed_hosts[0] "a.test:999`, `: the port 999`, `9…(1047552 more bytes) is outside 1..65535`}},
		{"1 MiB port that is not a number", parse(`{"network_mode":"allowlist","allowed_hosts":["a.test:` + big + `"]}`),
			[]string{`: the port "aaaa`, `a"…(1047552 more bytes) is not an integer`}},
		{"1 MiB port after an IPv6 address", parse(`{"network_mode":"allowlist","allowed_hosts":["2001:db8::1:` + big + `"]}`),
			[]string{`: an IPv6 address with a port needs brackets: [2001:db8::1]:aaaa`, `a…(1047552 more bytes)`}},
		{"1 MiB IPv6 zone", parse(`{"network_mode":"allowlist","allowed_hosts":["fe80::1%` + big + `"]}`),
			[]string{`: an IPv6 zone (%aaaa`, `a…(1047552 more bytes)) is not allowed`}},
		{"1 MiB prefix length", parse(`{"network_mode":"allowlist","allowed_hosts":["10.0.0.0/` + big + `"]}`),
			[]string{`: the prefix length /aaaa`, `a…(1047552 more bytes) is not valid for this address`}},
		{"1 MiB internationalised label", parse(`{"network_mode":"allowlist","allowed_hosts":["` + bigE + `-"]}`),
			[]string{`allowed_hosts[0] "éé`, `more bytes): the host name is longer than 1024 bytes as written`}},
		{"duplicate 1 MiB JSON key", parse(`{"` + big + `":1,"` + big + `":2}`),
			[]string{`invalid JSON: the key "aaaa`, `a"…(1047552 more bytes) appears twice in one object`}},
		{"duplicate 256 KiB YAML key", parse("? " + half[:mib/4] + "\n: 1\n? " + half[:mib/4] + "\n: 2\n"),
			[]string{`invalid YAML: line 3: the key "aaaa`, `a"…(261120 more bytes) appears twice in one mapping`}},
		{"512 KiB undefined YAML alias", parse("network_mode: *" + half + "\n"),
			[]string{"invalid YAML: yaml: unknown anchor 'aaaa", "a…(523298 more bytes)"}},
		{"512 KiB YAML tag", parse("network_mode: !x" + half + " public\n"),
			[]string{"invalid YAML: line 1: unsupported tag !xaaaa", "a…(523266 more bytes)"}},
		{"512 KiB YAML scalar yaml.v3 cannot decode", parse("network_mode: !!bool " + half + "\n"),
			[]string{"invalid YAML: line 1: yaml: cannot decode !!str `aaaa", "more bytes)"}},
		{"512 KiB network mode in YAML", parse("network_mode: " + halfE + "\n"),
			[]string{`network_mode "éé`, `é"…(523264 more bytes): unknown network mode`}},
		{"1 MiB env param number", func() error {
			_, err := ParseEnvParams([]byte(`{"allowlist_proxy_start_timeout":1` + strings.Repeat("0", mib) + `}`))
			return err
		}, []string{"allowlist_proxy_start_timeout 1000", "0…(1047553 more bytes): must be a positive number of seconds"}},
		{"1 MiB env param network", func() error {
			_, err := ParseEnvParams([]byte(`{"network":"` + big + ` "}`))
			return err
		}, []string{`network "aaaa`, `a"…(1047553 more bytes): must be a non-empty Docker network name`}},
		{"1 MiB task ID", func() error {
			_, err := ParseTasks(map[string]any{"task_id": big}, "tasks.json")
			return err
		}, []string{`task_id "aaaa`, `a"…(1047552 more bytes): must be 1-64 characters`}},
		{"1 MiB task key", func() error {
			_, err := ParseTasks(map[string]any{"task_id": "t", big: 1}, "tasks.json")
			return err
		}, []string{"aaaa", "a…(1047552 more bytes): unknown key; a task takes only"}},
		{"1 MiB recipe name", func() error {
			_, err := ParseRecipes(map[string]any{"name": big}, "r.json")
			return err
		}, []string{`name "aaaa`, `a"…(1047552 more bytes): must be 1-64 characters`}},
		{"1 MiB provider flag", func() error {
			return (&Planner{Provider: big}).Validate()
		}, []string{`provider "aaaa`, `a"…(1047552 more bytes): unknown provider`}},
		{"1 MiB docker network", func() error {
			_, err := (&Planner{Override: EnvParams{Network: "container:" + big}}).Plan(Task{ID: "t", Policies: PhasePolicies{PhaseRun: NoNetwork}})
			return err
		}, []string{`task "t": network "container:aaaa`, `a"…(1047562 more bytes): provider docker, run phase: network container:aaaa`, `a…(1047562 more bytes) shares a network namespace`}},
		{"a recipe's endpoint blocked by a policy of 100000 hosts", func() error {
			hosts := make([]Target, 100000)
			for i := range hosts {
				hosts[i] = Target{Kind: KindHost, Host: "h" + strconv.Itoa(i) + ".test"}
			}
			pl := &Planner{Recipes: []Recipe{{Name: "r", Required: []Endpoint{{Target: Target{Kind: KindHost, Host: "model.test", Port: 443}, Phase: PhaseRun}}}}}
			_, err := pl.Plan(Task{ID: "t", Policies: PhasePolicies{PhaseRun: {Mode: ModeAllowlist, Targets: hosts}}})
			return err
		}, []string{`task "t": run_network_policy "model.test:443": recipe r requires this endpoint in the run phase, but the effective run policy {"network_mode":"allowlist","allowed_hosts":["h0.test",`, `more bytes) (source: task) blocks it (not-allowlisted)`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			if len(msg) > 4<<10 || !utf8.ValidString(msg) {
				t.Fatalf("error message of %d bytes (valid UTF-8: %v), want under 4 KiB and valid: %.300q...", len(msg), utf8.ValidString(msg), msg)
			}
			rest := msg
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("error message %q\nlacks %q (after what came before it)", msg, w)
				}
				rest = rest[i+len(w):]
			}
		})
	}
}

// TestErrorMessagesUnderTheBound: a fragment of fragmentMax bytes still shows whole, as
// every message did before fragments were cut.
func TestErrorMessagesUnderTheBound(t *testing.T) {
	s := strings.Repeat("a", fragmentMax)
	url := "https://" + s[len("https://"):]
	_, err := Parse([]byte(`{"network_mode":"allowlist","allowed_hosts":["` + url + `"],"` + s + `":1}`))
	want := s + ": unknown key; a policy object takes only network_mode, allowed_hosts, denied_hosts\n" +
		`allowed_hosts[0] "` + url + `": a URL scheme is not allowed: write the host alone, e.g. "` + s[len("https://"):] + `"`
	if err == nil || err.Error() != want {
		t.Fatalf("Parse error = %v, want %s", err, want)
	}
}

// TestErrorCountIsBounded is the regression test for an input of a million bad entries,
// which gave a million errors (kept in memory, then one line each in the message and in
// the proxy admin API's "errors" array). A report keeps the first maxErrors errors, in
// input order, and ends with one line counting the rest; one at or under the limit is
// reported as it always was.
func TestErrorCountIsBounded(t *testing.T) {
	// One input of a million bad entries; the other large cases are smaller, enough to be
	// well past the limit without slowing the race detector down.
	const million, many = 1000000, 100000
	bad := func(n int) string { // a policy with n entries that are not targets
		return `{"network_mode":"allowlist","allowed_hosts":[` + strings.Repeat(`1,`, n-1) + `1]}`
	}
	entryErr := func(path string, i int) string {
		return path + "allowed_hosts[" + strconv.Itoa(i) + `] 1: a target is a string or an object {"host": ..., "port": ...}, not a number`
	}
	keys := make(map[string]any, many)
	keys["network_mode"] = "public"
	for i := 0; i < many; i++ {
		keys["k"+strconv.Itoa(million+i)] = 1
	}
	task := func(id string, n int) map[string]any {
		v, err := DecodeJSON([]byte(bad(n)))
		if err != nil {
			t.Fatal(err)
		}
		return map[string]any{"task_id": id, "run_network_policy": v}
	}
	ipv6 := make([]Target, 1000)
	for i := range ipv6 {
		ipv6[i], _ = ParseTarget("2001:db8::" + strconv.FormatInt(int64(i+1), 16))
	}
	manyTasks := make([]Task, many)
	for i := range manyTasks {
		manyTasks[i] = Task{ID: "t" + strconv.Itoa(i), Provider: ProviderDaytona, Policies: PhasePolicies{PhaseRun: {Mode: ModeDenylist}}}
	}

	tests := []struct {
		name  string
		run   func() error
		first string // the first line
		last  string // the last line
		lines int
	}{
		{"a million bad entries", func() error { _, err := Parse([]byte(bad(million))); return err },
			entryErr("", 0), "and 999900 more errors", maxErrors + 1},
		{"100000 unknown keys", func() error { _, err := ParseValue(keys, ""); return err },
			"k1000000: unknown key; a policy object takes only network_mode, allowed_hosts, denied_hosts", "and 99900 more errors", maxErrors + 1},
		{"exactly maxErrors bad entries", func() error { _, err := Parse([]byte(bad(maxErrors))); return err },
			entryErr("", 0), entryErr("", maxErrors-1), maxErrors},
		{"one past maxErrors", func() error { _, err := Parse([]byte(bad(maxErrors + 1))); return err },
			entryErr("", 0), "and 1 more error", maxErrors + 1},
		// Nested lists (each task's policy) add up exactly: 3 x 60 = 180 errors.
		{"three tasks of 60 bad entries", func() error {
			_, err := ParseTasks([]any{task("a", 60), task("b", 60), task("c", 60)}, "tasks.json")
			return err
		}, entryErr("[0].run_network_policy.", 0), "and 80 more errors", maxErrors + 1},
		{"a task of 1000 bad entries and a bad ID", func() error {
			tk := task("a", 1000)
			tk["task_id"] = "-"
			_, err := ParseTasks(tk, "tasks.json")
			return err
		}, `task_id "-": must be 1-64 characters of letters, digits, '.', '_' and '-', starting with a letter or digit`, "and 901 more errors", maxErrors + 1},
		{"a provider refusing 1000 entries in each of 3 phases", func() error {
			_, err := (&Planner{}).Plan(Task{ID: "t", Provider: ProviderDaytona, Policies: PhasePolicies{
				PhaseBaseline: {Mode: ModeAllowlist, Targets: ipv6}, PhaseRun: {Mode: ModeAllowlist, Targets: ipv6}, PhaseEvaluation: {Mode: ModeAllowlist, Targets: ipv6}}})
			return err
		}, `task "t": baseline_network_policy.allowed_hosts[0] "2001:db8::1": provider daytona, baseline phase: IPv6 entries are not supported`, `task "t": and 2900 more errors`, maxErrors + 1},
		{"100000 tasks that cannot be planned", func() error { _, err := (&Planner{}).PlanAll(manyTasks); return err },
			`task "t0": run_network_policy "denylist": provider daytona, run phase: cannot enforce denylist (it supports public, no-network, allowlist); only docker enforces a denylist, and it is never broadened to public`,
			"and 99900 more tasks cannot be planned", maxErrors + 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			lines := strings.Split(msg, "\n")
			if len(lines) != tc.lines || lines[0] != tc.first || lines[len(lines)-1] != tc.last {
				t.Fatalf("error of %d lines, first %q, last %q; want %d lines, first %q, last %q", len(lines), lines[0], lines[len(lines)-1], tc.lines, tc.first, tc.last)
			}
			if len(msg) > 64<<10 {
				t.Fatalf("error message of %d bytes, want at most 64 KiB", len(msg))
			}
			// What the proxy's admin API returns, one entry per FieldError.
			if fes := FieldErrors(err); len(fes) > maxErrors+1 {
				t.Fatalf("%d FieldErrors, want at most %d", len(fes), maxErrors+1)
			}
		})
	}
}

// A key or a YAML scalar holding line breaks does not spread one error over many lines:
// each error of a message is one line.
func TestErrorFragmentsAreOneLine(t *testing.T) {
	nl := strings.Repeat(`\n`, 250)
	for _, tc := range []struct {
		name   string
		run    func() error
		errors int
	}{
		{"policy key", func() error { _, err := Parse([]byte(`{"network_mode":"public","` + nl + `x":1}`)); return err }, 1},
		{"target key", func() error {
			_, err := Parse([]byte(`{"network_mode":"allowlist","allowed_hosts":[{"host":"a.test","` + nl + `\u2028":1}]}`))
			return err
		}, 1},
		{"task key", func() error {
			v, err := DecodeJSON([]byte(`[{"task_id":"t","` + nl + `x":1}]`))
			if err != nil {
				return err
			}
			_, err = ParseTasks(v, "")
			return err
		}, 1},
		{"YAML scalar", func() error { _, err := Parse([]byte("network_mode: !!bool \"" + nl + "\"\n")); return err }, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if err == nil {
				t.Fatal("no error")
			}
			if lines := strings.Count(err.Error(), "\n") + 1; lines != tc.errors || strings.Contains(err.Error(), "\u2028") {
				t.Fatalf("%d lines for %d errors: %q", lines, tc.errors, err.Error())
			}
		})
	}
}
