package policy

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseTargetAccepts(t *testing.T) {
	tests := []struct {
		in   string
		want string
		kind Kind
	}{
		{"www.example.com", "www.example.com", KindHost},
		{"WWW.Example.COM", "www.example.com", KindHost},
		{"www.example.com.", "www.example.com", KindHost},
		{"pypi.org:443", "pypi.org:443", KindHost},
		{"pypi.org:00443", "pypi.org:443", KindHost},
		{"*.example.com", "*.example.com", KindWildcard},
		{"*.Example.com.:8443", "*.example.com:8443", KindWildcard},
		{"bücher.example", "xn--bcher-kva.example", KindHost},
		{"xn--bcher-kva.example", "xn--bcher-kva.example", KindHost},
		{"BÜCHER.example", "xn--bcher-kva.example", KindHost},
		{"_dmarc.example.test", "_dmarc.example.test", KindHost},
		{"XN--BCHER-KVA.example", "xn--bcher-kva.example", KindHost},
		{"*.xn--bcher-kva.example", "*.xn--bcher-kva.example", KindWildcard},
		{"ab--cd.xn--bcher-kva.example", "ab--cd.xn--bcher-kva.example", KindHost},
		{"*.example.com.", "*.example.com", KindWildcard},
		{"example.com\u3002", "example.com", KindHost},
		{"example\uff0ecom", "example.com", KindHost},
		{"*\u3002example.com", "*.example.com", KindWildcard},
		{"*\uff0eexample\uff0ecom:443", "*.example.com:443", KindWildcard},
		{"*\uff61example.com", "*.example.com", KindWildcard},
		{"example.123", "example.123", KindHost},
		{strings.Repeat("a", 63) + ".test", strings.Repeat("a", 63) + ".test", KindHost},
		// 253 characters, the longest name; its root dot does not count.
		{strings.Repeat("abcdefghi.", 25) + "abc", strings.Repeat("abcdefghi.", 25) + "abc", KindHost},
		{strings.Repeat("abcdefghi.", 25) + "abc.", strings.Repeat("abcdefghi.", 25) + "abc", KindHost},
		// Five numbers are no inet_aton address, so this is a name like "example.123".
		{"1.2.3.4.5", "1.2.3.4.5", KindHost},
		{"xn--i-7iq.example", "xn--i-7iq.example", KindHost},
		{"localhost", "localhost", KindHost},
		{"203.0.113.10", "203.0.113.10", KindAddr},
		{"203.0.113.10:8443", "203.0.113.10:8443", KindAddr},
		{"203.0.113.10/32", "203.0.113.10", KindAddr},
		{"203.0.113.0/24", "203.0.113.0/24", KindPrefix},
		{"203.0.113.0/24:443", "203.0.113.0/24:443", KindPrefix},
		{"0.0.0.0/0", "0.0.0.0/0", KindPrefix},
		{"2001:db8::1", "2001:db8::1", KindAddr},
		{"2001:DB8:0:0::1", "2001:db8::1", KindAddr},
		{"[2001:db8::1]:443", "[2001:db8::1]:443", KindAddr},
		{"[2001:db8::1]", "2001:db8::1", KindAddr},
		{"2001:db8::/32", "2001:db8::/32", KindPrefix},
		{"[2001:db8::/32]:443", "[2001:db8::/32]:443", KindPrefix},
		{"2001:db8::1/128", "2001:db8::1", KindAddr},
		{"::ffff:203.0.113.10", "203.0.113.10", KindAddr},
		{"[::ffff:203.0.113.10]:443", "203.0.113.10:443", KindAddr},
		{"::ffff:203.0.113.0/120", "203.0.113.0/24", KindPrefix},
		{"::ffff:0.0.0.0/96", "0.0.0.0/0", KindPrefix},
		{"::/64", "::/64", KindPrefix},
		{"a:1", "a:1", KindHost},
		{"a:65535", "a:65535", KindHost},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseTarget(tc.in)
			if err != nil {
				t.Fatalf("ParseTarget(%q): %v", tc.in, err)
			}
			if got.String() != tc.want || got.Kind != tc.kind {
				t.Fatalf("ParseTarget(%q) = %q (%v), want %q (%v)", tc.in, got, got.Kind, tc.want, tc.kind)
			}
			again, err := ParseTarget(got.String())
			if err != nil || again != got {
				t.Fatalf("canonical form %q does not parse back to itself: %v, %v", got, again, err)
			}
		})
	}
}

func TestParseTargetRejects(t *testing.T) {
	tests := []struct {
		in   string
		rule string // a fragment of the expected message
	}{
		{"", "empty target"},
		{"https://pypi.org", "URL scheme"},
		{"https://pypi.org/simple", "URL scheme"},
		{"pypi.org/simple", "path is not allowed"},
		{"pypi.org /x", "whitespace"},
		{" pypi.org", "whitespace"},
		{"pypi.org\t", "whitespace"},
		{"pypi\u00a0org", "whitespace"},
		{"api.*.example.com", "only a leading wildcard"},
		{"example.*", "only a leading wildcard"},
		{"*example.com", "whole leading label"},
		{"*", "bare '*'"},
		{"*.*.example.com", "single leading"},
		{"*.203.0.113.1", "not to addresses"},
		{"203.0.113.1/24", "canonical (host bits zero): did you mean 203.0.113.0/24"},
		{"2001:db8::1/32", "did you mean 2001:db8::/32"},
		{"203.0.113.0/33", "prefix length"},
		{"pypi.org:0", "outside 1..65535"},
		{"pypi.org:65536", "outside 1..65535"},
		{"pypi.org:99999999999", "outside 1..65535"},
		{"pypi.org:https", "not an integer"},
		{"pypi.org:-1", "not an integer"},
		{"pypi.org:+443", "not an integer"},
		{"pypi.org:443.0", "not an integer"},
		{"pypi.org\u3000", "whitespace"},
		{"pypi.org\n", "whitespace"},
		{"[fe80::1%eth0]:443", "zone"},
		{"1.2.3", "dotted-decimal"},
		{"0x7f.1", "dotted-decimal"},
		{"017.0.0.1", "dotted-decimal"},
		// Dotted-decimal already, but with a trailing dot or non-ASCII digits: the message
		// says what is wrong rather than asking for the form the address is in.
		{"203.0.113.10.", `"203.0.113.10." is the IPv4 address 203.0.113.10: write it as a.b.c.d in ASCII digits, with no trailing dot`},
		{"203.0.113.10.:443", `is the IPv4 address 203.0.113.10: write it`},
		{"\uff12\uff10\uff13.0.113.10", `is the IPv4 address 203.0.113.10: write it`},
		{"*.203.0.113.10.", `is the IPv4 address 203.0.113.10: write it`},
		{"*.", "empty"},
		{"pypi.org:", "port after ':' is empty"},
		{"2001:db8:0:0:0:0:0:1:443", "needs brackets"},
		{"[pypi.org]:443", "brackets are only for an IPv6"},
		{"[2001:db8::1]443", "only ':port' may follow"},
		{"[2001:db8::1", "no closing"},
		{"fe80::1%eth0", "zone"},
		{"127.1", "dotted-decimal"},
		{"2130706433", "dotted-decimal"},
		{"0x7f.0.0.1", "dotted-decimal"},
		{"0177.0.0.1", "dotted-decimal"},
		// The address of a CIDR breaks the same rules as an address alone.
		{"010.0.0.0/8", "dotted-decimal"},
		{"127.1/16", "dotted-decimal"},
		{"0x7f.0.0.0/8", "dotted-decimal"},
		{"fe80::%eth0/64", "zone"},
		{"[fe80::%eth0/64]:443", "zone"},
		{"user@pypi.org", "not allowed in a host name"},
		{"pypi..org", "empty label"},
		{"pypi.org..", "empty label"},
		{".", "empty label"},
		{"-pypi.org", "starts or ends with '-'"},
		{strings.Repeat("a", 64) + ".test", "longer than 63"},
		{strings.Repeat("abcdefghi.", 26) + "test", "longer than 253"},
		{strings.Repeat("abcdefghi.", 25) + "abcd", "longer than 253"},
		{"pypi-.org", "starts or ends with '-'"},
		// Brackets are for IPv6 only (docs/policy.md §2): an IPv4 address or range takes its port bare.
		{"[203.0.113.10]:443", "brackets are only for an IPv6"},
		{"[203.0.113.0/24]:443", "brackets are only for an IPv6"},
		{"89.1", "dotted-decimal"},
		{"0X7F.0.0.0/8", "dotted-decimal"},
		{"pypi\xff.org", "not valid UTF-8"},
		{"a:b:c", "not a valid IPv6"},
		// An "xn--" label must be the punycode of a valid internationalised label.
		{"xn--zz.example", `the label "xn--zz" is not a valid IDN A-label`},
		{"www.xn--a.example:443", `the label "xn--a" is not a valid IDN A-label`},
		{"*.XN--ZZ.example", `the label "xn--zz" is not a valid IDN A-label`},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseTarget(tc.in)
			if err == nil {
				t.Fatalf("ParseTarget(%q) = %q, want an error mentioning %q", tc.in, got, tc.rule)
			}
			if !strings.Contains(err.Error(), tc.rule) {
				t.Fatalf("ParseTarget(%q) error %q does not mention %q", tc.in, err, tc.rule)
			}
		})
	}
}

func TestParseValue(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string // canonical JSON; empty when an error is expected
		errs []string
	}{
		{name: "public string", in: `"public"`, want: `"public"`},
		{name: "no-network string", in: `"no-network"`, want: `"no-network"`},
		{name: "public object", in: `{"network_mode":"public"}`, want: `"public"`},
		{name: "no-network object", in: `{"network_mode":"no-network"}`, want: `"no-network"`},
		{name: "allowlist", in: `{"network_mode":"allowlist","allowed_hosts":["pypi.org","registry.npmjs.org:443","*.example.com","203.0.113.10","203.0.113.0/24"]}`,
			want: `{"network_mode":"allowlist","allowed_hosts":["pypi.org","registry.npmjs.org:443","*.example.com","203.0.113.10","203.0.113.0/24"]}`},
		{name: "empty allowlist allows nothing", in: `{"network_mode":"allowlist","allowed_hosts":[]}`, want: `{"network_mode":"allowlist","allowed_hosts":[]}`},
		{name: "empty denylist denies nothing", in: `{"network_mode":"denylist","denied_hosts":[]}`, want: `{"network_mode":"denylist","denied_hosts":[]}`},
		{name: "object target folded", in: `{"network_mode":"denylist","denied_hosts":[{"host":"registry.npmjs.org","port":443},{"host":"2001:db8::1","port":443}]}`,
			want: `{"network_mode":"denylist","denied_hosts":["registry.npmjs.org:443","[2001:db8::1]:443"]}`},
		{name: "object target without port", in: `{"network_mode":"allowlist","allowed_hosts":[{"host":"Pypi.org."}]}`, want: `{"network_mode":"allowlist","allowed_hosts":["pypi.org"]}`},
		{name: "duplicates dropped after canonicalisation", in: `{"network_mode":"allowlist","allowed_hosts":["a.test","A.TEST.","a.test:443",{"host":"a.test","port":443},"203.0.113.10/32","203.0.113.10"]}`,
			want: `{"network_mode":"allowlist","allowed_hosts":["a.test","a.test:443","203.0.113.10"]}`},

		{name: "unknown mode string", in: `"offline"`, errs: []string{`policy "offline": unknown network mode`}},
		{name: "allowlist as string", in: `"allowlist"`, errs: []string{`needs the object form with "allowed_hosts"`}},
		{name: "number", in: `42`, errs: []string{`policy 42: a policy is a string`}},
		{name: "missing mode", in: `{"allowed_hosts":[]}`, errs: []string{`network_mode: is required`}},
		{name: "unknown mode", in: `{"network_mode":"open"}`, errs: []string{`network_mode "open": unknown network mode`}},
		{name: "allowlist without key", in: `{"network_mode":"allowlist"}`, errs: []string{`allowed_hosts: is required for an allowlist policy`}},
		{name: "denylist without key", in: `{"network_mode":"denylist"}`, errs: []string{`denied_hosts: is required`}},
		{name: "allowed_hosts on denylist", in: `{"network_mode":"denylist","denied_hosts":[],"allowed_hosts":[]}`, errs: []string{`allowed_hosts: a denylist policy takes denied_hosts, not allowed_hosts`}},
		{name: "denied_hosts on allowlist", in: `{"network_mode":"allowlist","allowed_hosts":[],"denied_hosts":[]}`, errs: []string{`denied_hosts: an allowlist policy takes allowed_hosts`}},
		{name: "host list on public", in: `{"network_mode":"public","allowed_hosts":[]}`, errs: []string{`allowed_hosts: a public policy takes no host list`}},
		{name: "host list on no-network", in: `{"network_mode":"no-network","denied_hosts":["x.test"]}`, errs: []string{`denied_hosts: a no-network policy takes no host list`}},
		{name: "unknown key", in: `{"network_mode":"public","mode":"x"}`, errs: []string{`mode: unknown key; a policy object takes only network_mode, allowed_hosts, denied_hosts`}},
		{name: "native knob modal", in: `{"network_mode":"no-network","block_network":true}`, errs: []string{`block_network: block_network is a provider-native (modal) option`}},
		{name: "native knob daytona", in: `{"network_mode":"allowlist","allowed_hosts":[],"networkBlockAll":true}`, errs: []string{`networkBlockAll is a provider-native (daytona) option`}},
		{name: "native knob cidr_allowlist", in: `{"network_mode":"allowlist","allowed_hosts":[],"cidr_allowlist":[]}`, errs: []string{`cidr_allowlist: cidr_allowlist is a provider-native`}},
		{name: "native knob network_allow_list", in: `{"network_mode":"allowlist","allowed_hosts":[],"network_allow_list":[]}`, errs: []string{`network_allow_list is a provider-native`}},
		{name: "hosts not a list", in: `{"network_mode":"allowlist","allowed_hosts":"pypi.org"}`, errs: []string{`allowed_hosts "pypi.org": must be a list of targets, not a string`}},
		{name: "hosts null", in: `{"network_mode":"allowlist","allowed_hosts":null}`, errs: []string{`allowed_hosts null: must be a list`}},
		{name: "every bad entry named", in: `{"network_mode":"allowlist","allowed_hosts":["ok.test","https://x","a b",""]}`, errs: []string{
			`allowed_hosts[1] "https://x": a URL scheme is not allowed`,
			`allowed_hosts[2] "a b": whitespace`,
			`allowed_hosts[3] "": an empty target is not allowed`}},
		{name: "entry of wrong type", in: `{"network_mode":"allowlist","allowed_hosts":[443]}`, errs: []string{`allowed_hosts[0] 443: a target is a string or an object`}},
		{name: "object unknown key", in: `{"network_mode":"allowlist","allowed_hosts":[{"host":"a.test","proto":"tcp"}]}`, errs: []string{`allowed_hosts[0].proto: unknown key; a target object takes only host and port`}},
		{name: "object without host", in: `{"network_mode":"allowlist","allowed_hosts":[{"port":443}]}`, errs: []string{`allowed_hosts[0].host: is required`}},
		{name: "object host not string", in: `{"network_mode":"allowlist","allowed_hosts":[{"host":1}]}`, errs: []string{`allowed_hosts[0].host 1: must be a string`}},
		{name: "port and suffix", in: `{"network_mode":"allowlist","allowed_hosts":[{"host":"a.test:443","port":443}]}`, errs: []string{`allowed_hosts[0] "a.test:443": give the port either as a ':port' suffix or as the port field, not both`}},
		{name: "port not integer", in: `{"network_mode":"allowlist","allowed_hosts":[{"host":"a.test","port":443.5}]}`, errs: []string{`allowed_hosts[0].port 443.5: the port must be an integer`}},
		{name: "port exponent", in: `{"network_mode":"allowlist","allowed_hosts":[{"host":"a.test","port":4e2}]}`, errs: []string{`the port must be an integer`}},
		{name: "port as string", in: `{"network_mode":"allowlist","allowed_hosts":[{"host":"a.test","port":"443"}]}`, errs: []string{`allowed_hosts[0].port "443": the port must be an integer, not a string`}},
		{name: "port zero", in: `{"network_mode":"allowlist","allowed_hosts":[{"host":"a.test","port":0}]}`, errs: []string{`the port must be in 1..65535`}},
		{name: "port too big", in: `{"network_mode":"allowlist","allowed_hosts":[{"host":"a.test","port":70000}]}`, errs: []string{`the port must be in 1..65535`}},
		// 65536 would wrap to 0 in a uint16, which means every port.
		{name: "port one past the bound", in: `{"network_mode":"allowlist","allowed_hosts":[{"host":"a.test","port":65536}]}`, errs: []string{`allowed_hosts[0].port 65536: the port must be in 1..65535`}},
		{name: "port at the bounds", in: `{"network_mode":"allowlist","allowed_hosts":[{"host":"a.test","port":1},{"host":"a.test","port":65535}]}`,
			want: `{"network_mode":"allowlist","allowed_hosts":["a.test:1","a.test:65535"]}`},
		{name: "object host bad", in: `{"network_mode":"allowlist","allowed_hosts":[{"host":"api.*.test"}]}`, errs: []string{`allowed_hosts[0].host "api.*.test": only a leading wildcard`}},
		{name: "duplicate key", in: `{"network_mode":"public","network_mode":"no-network"}`, errs: []string{`the key "network_mode" appears twice`}},
		{name: "trailing data", in: `"public" "no-network"`, errs: []string{`unexpected data after the first value`}},
		// The refusals of docs/policy.md §2 that the rows above do not already show.
		{name: "mode null", in: `{"network_mode":null}`, errs: []string{`network_mode null: unknown network mode`}},
		{name: "mode case variant", in: `{"network_mode":"Public"}`, errs: []string{`network_mode "Public": unknown network mode`}},
		{name: "mode string case variant", in: `"NO-NETWORK"`, errs: []string{`policy "NO-NETWORK": unknown network mode`}},
		{name: "policy null", in: `null`, errs: []string{`policy null: a policy is a string`}},
		{name: "null host list on public", in: `{"network_mode":"public","allowed_hosts":null}`, errs: []string{`allowed_hosts: a public policy takes no host list`}},
		{name: "empty host list on no-network", in: `{"network_mode":"no-network","denied_hosts":[]}`, errs: []string{`denied_hosts: a no-network policy takes no host list`}},
		{name: "null entry", in: `{"network_mode":"allowlist","allowed_hosts":[null]}`, errs: []string{`allowed_hosts[0] null: a target is a string or an object`}},
		{name: "null port", in: `{"network_mode":"allowlist","allowed_hosts":[{"host":"a.test","port":null}]}`, errs: []string{`allowed_hosts[0].port null: the port must be an integer, not null`}},
		{name: "negative port", in: `{"network_mode":"allowlist","allowed_hosts":[{"host":"a.test","port":-443}]}`, errs: []string{`allowed_hosts[0].port -443: the port must be in 1..65535`}},
		{name: "native knob in a target", in: `{"network_mode":"allowlist","allowed_hosts":[{"host":"a.test","block_network":true}]}`, errs: []string{`allowed_hosts[0].block_network: unknown key`}},
		{name: "unicode line separator", in: `{"network_mode":"allowlist","allowed_hosts":["a.test\u2028"]}`, errs: []string{`whitespace and control characters are not allowed`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.in))
			if tc.want != "" {
				if err != nil {
					t.Fatalf("Parse(%s): %v", tc.in, err)
				}
				b, _ := json.Marshal(got)
				if string(b) != tc.want {
					t.Fatalf("Parse(%s) = %s, want %s", tc.in, b, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse(%s) = %v, want errors %q", tc.in, got, tc.errs)
			}
			for _, frag := range tc.errs {
				if !strings.Contains(err.Error(), frag) {
					t.Errorf("Parse(%s) error\n%s\ndoes not contain %q", tc.in, err, frag)
				}
			}
		})
	}
}

func TestParseValuePathPrefix(t *testing.T) {
	v, err := DecodeJSON([]byte(`{"network_mode":"allowlist","allowed_hosts":["ok.test","ok.test","https://x"]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = ParseValue(v, "run_network_policy")
	want := `run_network_policy.allowed_hosts[2] "https://x": a URL scheme is not allowed: write the host alone, e.g. "x"`
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v, want %s", err, want)
	}
	fes := FieldErrors(err)
	if len(fes) != 1 || fes[0].Path != "run_network_policy.allowed_hosts[2]" || fes[0].Value != `"https://x"` {
		t.Fatalf("FieldErrors = %+v", fes)
	}
}

func TestParseYAML(t *testing.T) {
	got, err := Parse([]byte("network_mode: allowlist\nallowed_hosts:\n  - pypi.org\n  - {host: registry.npmjs.org, port: 443}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s := got.String(); s != `{"network_mode":"allowlist","allowed_hosts":["pypi.org","registry.npmjs.org:443"]}` {
		t.Fatalf("got %s", s)
	}
	for _, bad := range []struct{ in, frag string }{
		{"network_mode: public\nnetwork_mode: no-network\n", "appears twice"},
		{"network_mode: allowlist\nallowed_hosts: [{host: a.test, port: 1.5}]\n", "the port must be an integer"},
		{"network_mode: allowlist\nallowed_hosts: [{host: a.test, port: '443'}]\n", "not a string"},
		{"network_mode: allowlist\nallowed_hosts: [a.test]\nextra: 1\n", "extra: unknown key"},
		{"", "empty"},
		{"network_mode: public\n---\nnetwork_mode: no-network\n", "more than one document"},
		// yaml.v3 (and YAML 1.1 readers) take 0443 as octal, 291; YAML 1.2 as 443.
		{"network_mode: allowlist\nallowed_hosts: [{host: a.test, port: 0443}]\n", "line 2: the number 0443 has a leading zero"},
		{"network_mode: allowlist\nallowed_hosts:\n  - host: a.test\n    port: 0777\n", "line 4: the number 0777 has a leading zero"},
		{"network_mode: allowlist\nallowed_hosts: [{host: a.test, port: 0999}]\n", "the number 0999 has a leading zero"},
		{"network_mode: allowlist\nallowed_hosts: [{host: a.test, port: -0443}]\n", "the number -0443 has a leading zero"},
		{"network_mode: allowlist\nallowed_hosts: [{host: a.test, port: 0_443}]\n", "the number 0_443 has a leading zero"},
		{"network_mode: allowlist\nallowed_hosts: [{host: a.test, port: +0443}]\n", "the number +0443 has a leading zero"},
		{"network_mode: allowlist\nallowed_hosts: [{host: a.test, port: 01}]\n", "the number 01 has a leading zero"},
		{"network_mode: allowlist\nallowed_hosts: [{host: a.test, port: 0}]\n", "port 0: the port must be in 1..65535"},
		{"network_mode: allowlist\nallowed_hosts: [{host: a.test, port: 0.5}]\n", "port 0.5: the port must be an integer"},
	} {
		if _, err := Parse([]byte(bad.in)); err == nil || !strings.Contains(err.Error(), bad.frag) {
			t.Errorf("Parse(%q) error = %v, want %q", bad.in, err, bad.frag)
		}
	}
}

func TestDigestIgnoresSpelling(t *testing.T) {
	a, err := Parse([]byte(`{"network_mode":"allowlist","allowed_hosts":[{"host":"A.test","port":443}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Parse([]byte(`{"network_mode":"allowlist","allowed_hosts":["a.test.:443"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if a.Digest() != b.Digest() || !strings.HasPrefix(a.Digest(), "sha256:") {
		t.Fatalf("digests differ: %s %s", a.Digest(), b.Digest())
	}
	if !a.Equal(b) {
		t.Fatalf("%s and %s are not Equal", a, b)
	}
	// Same mode, another target: neither Equal nor the same digest.
	c, err := Parse([]byte(`{"network_mode":"allowlist","allowed_hosts":["a.test:80"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if a.Equal(c) || a.Digest() == c.Digest() {
		t.Fatalf("%s and %s compare equal", a, c)
	}
	if Public.Digest() == NoNetwork.Digest() {
		t.Fatal("public and no-network share a digest")
	}
}

// Restricted decides whether the Docker controller takes the agent off its outside
// networks: every mode but public restricts, also a list-mode policy with no entries.
func TestPolicyRestricted(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{`"public"`, false},
		{`"no-network"`, true},
		{`{"network_mode":"allowlist","allowed_hosts":[]}`, true},
		{`{"network_mode":"denylist","denied_hosts":[]}`, true},
	} {
		p, err := Parse([]byte(tc.in))
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Restricted(); got != tc.want {
			t.Errorf("%s.Restricted() = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestUnmarshalJSON(t *testing.T) {
	var holder struct {
		P Policy `json:"p"`
	}
	if err := json.Unmarshal([]byte(`{"p":{"network_mode":"no-network"}}`), &holder); err != nil || holder.P.Mode != ModeNoNetwork {
		t.Fatalf("got %+v, %v", holder, err)
	}
	if err := json.Unmarshal([]byte(`{"p":{"network_mode":"allowlist"}}`), &holder); err == nil {
		t.Fatal("an allowlist without allowed_hosts was accepted")
	}
}
