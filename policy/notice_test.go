package policy

import "testing"

func planTestPolicy(t *testing.T, doc string) Policy {
	t.Helper()
	p, err := Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse(%s): %v", doc, err)
	}
	return p
}

func TestRestrictionNotice(t *testing.T) {
	tests := []struct {
		name   string
		policy string
		want   string
	}{
		{"allowlist from the guide", `{"network_mode":"allowlist","allowed_hosts":["pypi.org","registry.npmjs.org:443"]}`, referenceAllowlist},
		{"object form and case fold to canonical lines", `{"network_mode":"allowlist","allowed_hosts":["PyPI.org.",{"host":"registry.npmjs.org","port":443}]}`, referenceAllowlist},
		{"no-network from the guide", `"no-network"`, referenceNoNetwork},
		{"no-network object form", `{"network_mode":"no-network"}`, referenceNoNetwork},
		{"denylist from the guide", `{"network_mode":"denylist","denied_hosts":[{"host":"example.com","port":443}]}`, referenceDenylist},
		{"public adds none", `"public"`, ""},
		{"empty allowlist allows nothing: the no-network text", `{"network_mode":"allowlist","allowed_hosts":[]}`, referenceNoNetwork},
		{"empty denylist: the denylist text without target lines", `{"network_mode":"denylist","denied_hosts":[]}`,
			"<IMPORTANT>\n" +
				"  Network Restriction Statement:\n" +
				"  Ignore any duplicate or conflicting declarations about network access elsewhere in the instructions; follow this statement instead.\n" +
				"  This statement has the highest priority for network access because it explicitly reflects the effective network policy applied to the task sandbox.\n" +
				"  Outbound network access from the task environment is available except for the following blocked targets:\n" +
				"  Do not repeatedly retry access to these blocked targets.\n" +
				"</IMPORTANT>"},
		{
			"every target form on its own line",
			`{"network_mode":"allowlist","allowed_hosts":["*.example.test","[2001:db8::1]:443","203.0.113.0/24","2001:db8::/32","198.51.100.7:8443"]}`,
			"<IMPORTANT>\n" +
				"  Network Restriction Statement:\n" +
				"  Ignore any duplicate or conflicting declarations about network access elsewhere in the instructions; follow this statement instead.\n" +
				"  This statement has the highest priority for network access because it explicitly reflects the effective network policy applied to the task sandbox.\n" +
				"  Outbound network access from the task environment is restricted to the following targets:\n" +
				"  - *.example.test\n" +
				"  - [2001:db8::1]:443\n" +
				"  - 203.0.113.0/24\n" +
				"  - 2001:db8::/32\n" +
				"  - 198.51.100.7:8443\n" +
				"  All other outbound targets are blocked. Do not repeatedly retry access to blocked targets.\n" +
				"</IMPORTANT>",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RestrictionNotice(planTestPolicy(t, tt.policy)); got != tt.want {
				t.Errorf("RestrictionNotice(%s) =\n%q\nwant\n%q", tt.policy, got, tt.want)
			}
		})
	}
}

func TestAppendNotice(t *testing.T) {
	tests := []struct{ instruction, notice, want string }{
		{"Fix the bug.", "", "Fix the bug."},
		{"Fix the bug.\n\n", "<IMPORTANT>x</IMPORTANT>", "Fix the bug.\n\n<IMPORTANT>x</IMPORTANT>"},
		{"Fix the bug.", "<IMPORTANT>x</IMPORTANT>", "Fix the bug.\n\n<IMPORTANT>x</IMPORTANT>"},
		{"", "<IMPORTANT>x</IMPORTANT>", "<IMPORTANT>x</IMPORTANT>"},
	}
	for _, tt := range tests {
		if got := AppendNotice(tt.instruction, tt.notice); got != tt.want {
			t.Errorf("AppendNotice(%q, %q) = %q, want %q", tt.instruction, tt.notice, got, tt.want)
		}
	}
}
