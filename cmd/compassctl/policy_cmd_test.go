package main

import (
	"strings"
	"testing"
)

func TestPolicyCheck(t *testing.T) {
	tests := []struct {
		name, policy string
		code         int
		stdout       string
		stderr       string
	}{
		{"string form", `"no-network"`, 0, "\"no-network\"\n", ""},
		{"object form of public", `{"network_mode":"public"}`, 0, "\"public\"\n", ""},
		{"canonical form", `{"network_mode":"allowlist","allowed_hosts":["PyPI.test.","pypi.test",{"host":"registry.pkg.test","port":443},"[2001:db8::1]:443"]}`, 0,
			`{"network_mode":"allowlist","allowed_hosts":["pypi.test","registry.pkg.test:443","[2001:db8::1]:443"]}` + "\n", ""},
		{"bare word", `no-network`, 0, "\"no-network\"\n", ""},
		{"YAML written by a person", "network_mode: denylist\ndenied_hosts: [exfil.test]", 0, `{"network_mode":"denylist","denied_hosts":["exfil.test"]}` + "\n", ""},
		{"every error at once", `{"network_mode":"allowlist","allowed_hosts":["https://x","a.*.test","203.0.113.1/24"]}`, 2, "",
			"compassctl: policy: allowed_hosts[0] \"https://x\": a URL scheme is not allowed: write the host alone, e.g. \"x\"\n" +
				"policy: allowed_hosts[1] \"a.*.test\": only a leading wildcard is allowed (\"*.example.com\"), not an embedded or trailing one\n" +
				"policy: allowed_hosts[2] \"203.0.113.1/24\": a CIDR must be canonical (host bits zero): did you mean 203.0.113.0/24?\n"},
		{"provider-native knob", `{"network_mode":"no-network","block_network":true}`, 2, "", "block_network is a provider-native (modal) option"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCaptured(t, "policy", "check", tt.policy)
			if code != tt.code || stdout != tt.stdout || !strings.Contains(stderr, tt.stderr) || (tt.stderr == "" && stderr != "") {
				t.Errorf("exit %d stdout %q stderr %q; want exit %d stdout %q stderr containing %q", code, stdout, stderr, tt.code, tt.stdout, tt.stderr)
			}
		})
	}
	if code, stdout, _ := runCaptured(t, "policy", "check"); code != 2 || stdout != "" {
		t.Errorf("policy check without an argument: exit %d stdout %q, want 2 and nothing", code, stdout)
	}
}

func TestPolicyMatch(t *testing.T) {
	allow := `{"network_mode":"allowlist","allowed_hosts":["pypi.test","registry.pkg.test:443","*.example.test","203.0.113.0/24","[2001:db8::1]:8443"]}`
	deny := `{"network_mode":"denylist","denied_hosts":["exfil.test:443"]}`
	tests := []struct {
		args []string
		want string
	}{
		{[]string{allow, "pypi.test"}, "allow rule=pypi.test reason=allowlisted\n"},
		{[]string{allow, "PYPI.test."}, "allow rule=pypi.test reason=allowlisted\n"},
		{[]string{allow, "registry.pkg.test"}, "allow rule=registry.pkg.test:443 reason=allowlisted\n"},
		{[]string{allow, "registry.pkg.test:80"}, "deny rule=- reason=not-allowlisted\n"},
		{[]string{allow, "api.example.test:8080"}, "allow rule=*.example.test reason=allowlisted\n"},
		{[]string{allow, "example.test"}, "deny rule=- reason=not-allowlisted\n"},
		{[]string{allow, "cdn.other.test", "--resolve", "203.0.113.9"}, "allow rule=203.0.113.0/24 reason=allowlisted\n"},
		{[]string{allow, "cdn.other.test"}, "deny rule=- reason=not-allowlisted\n"},
		{[]string{allow, "203.0.113.200"}, "allow rule=203.0.113.0/24 reason=allowlisted\n"},
		{[]string{allow, "[2001:db8::1]:8443"}, "allow rule=[2001:db8::1]:8443 reason=allowlisted\n"},
		{[]string{allow, "2001:db8::1"}, "deny rule=- reason=not-allowlisted\n"},
		{[]string{deny, "exfil.test"}, "deny rule=exfil.test:443 reason=denylisted\n"},
		{[]string{deny, "exfil.test:80"}, "allow rule=- reason=not-denylisted\n"},
		{[]string{`"no-network"`, "model.test"}, "deny rule=- reason=no-network\n"},
		{[]string{`"public"`, "model.test"}, "allow rule=- reason=public\n"},
		// A name that resolves to an internal address is blocked unless an IP rule allows it.
		{[]string{`"public"`, "metadata.test", "--resolve", "169.254.169.254"}, "deny rule=- reason=internal-address\n"},
		{[]string{allow, "pypi.test", "--resolve", "127.0.0.1"}, "deny rule=- reason=internal-address\n"},
		{[]string{`{"network_mode":"allowlist","allowed_hosts":["local.test","127.0.0.1"]}`, "local.test", "--resolve", "127.0.0.1"}, "allow rule=local.test reason=allowlisted\n"},
		{[]string{`"public"`, "169.254.169.254:80"}, "deny rule=- reason=internal-address\n"},
		{[]string{`"public"`, "x.test", "--resolve", "::ffff:127.0.0.1"}, "deny rule=- reason=internal-address\n"},
		{[]string{`{"network_mode":"allowlist","allowed_hosts":["127.0.0.0/8"]}`, "127.0.0.1:8080"}, "allow rule=127.0.0.0/8 reason=allowlisted\n"},
		{[]string{`{"network_mode":"denylist","denied_hosts":[]}`, "[::1]:443"}, "deny rule=- reason=internal-address\n"},
		// Only a rule inside the internal range lifts the guard: /0 allows everything
		// outside but opens nothing internal, in either address family.
		{[]string{`{"network_mode":"allowlist","allowed_hosts":["0.0.0.0/0","::/0"]}`, "127.0.0.1:8080"}, "deny rule=- reason=internal-address\n"},
		{[]string{`{"network_mode":"allowlist","allowed_hosts":["0.0.0.0/0","::/0"]}`, "[::ffff:127.0.0.1]:8080"}, "deny rule=- reason=internal-address\n"},
		{[]string{`{"network_mode":"allowlist","allowed_hosts":["0.0.0.0/0"]}`, "x.test", "--resolve", "169.254.169.254"}, "deny rule=- reason=internal-address\n"},
		{[]string{`{"network_mode":"allowlist","allowed_hosts":["0.0.0.0/0"]}`, "198.51.100.7:443"}, "allow rule=0.0.0.0/0 reason=allowlisted\n"},
		// An IPv4-mapped address is decided as the IPv4 address the proxy dials.
		{[]string{`{"network_mode":"allowlist","allowed_hosts":["198.51.100.0/24"]}`, "x.test", "--resolve", "::ffff:198.51.100.7"}, "allow rule=198.51.100.0/24 reason=allowlisted\n"},
		// Private-use addresses are ordinary unless --deny-private asks the sidecar's
		// question; then a rule inside the range lifts the guard, as for loopback.
		{[]string{`{"network_mode":"denylist","denied_hosts":[]}`, "lan.test", "--resolve", "10.1.2.3"}, "allow rule=- reason=not-denylisted\n"},
		{[]string{`{"network_mode":"denylist","denied_hosts":[]}`, "lan.test", "--resolve", "10.1.2.3", "--deny-private"}, "deny rule=- reason=internal-address\n"},
		{[]string{`{"network_mode":"allowlist","allowed_hosts":["10.0.0.0/8"]}`, "10.1.2.3", "--deny-private"}, "allow rule=10.0.0.0/8 reason=allowlisted\n"},
	}
	for _, tt := range tests {
		code, stdout, stderr := runCaptured(t, append([]string{"policy", "match"}, tt.args...)...)
		if code != 0 || stdout != tt.want || stderr != "" {
			t.Errorf("policy match %q: exit %d stdout %q stderr %q, want exit 0 and %q", tt.args, code, stdout, stderr, tt.want)
		}
	}
}

func TestPolicyMatchRefusesBadInput(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{`"allow"`, "x.test"}, `policy: policy "allow": unknown network mode`},
		{[]string{`"public"`, "https://x.test"}, `destination "https://x.test": a URL scheme is not allowed`},
		{[]string{`"public"`, "*.x.test"}, "a destination is one host name or address, not a wildcard or a range"},
		{[]string{`"public"`, "203.0.113.0/24"}, "a destination is one host name or address"},
		{[]string{`"public"`, "203.0.113.7", "--resolve", "203.0.113.7"}, `--resolve is for a host name; "203.0.113.7" is already an address`},
		{[]string{`"public"`, "x.test", "--resolve", "x.test"}, `--resolve "x.test": not an IP address`},
		{[]string{`"public"`, "x.test", "--resolve", "fe80::1%eth0"}, `--resolve "fe80::1%eth0": not an IP address`},
		{[]string{`"public"`, "x.test:0"}, "outside 1..65535"},
		{[]string{`"public"`}, "want POLICY_JSON HOST[:PORT]: HOST[:PORT] is missing"},
	}
	if code, stdout, stderr := runCaptured(t, "policy", "chek", `"public"`); code != 2 || stdout != "" || !strings.Contains(stderr, `unknown command "chek" for "compassctl policy"`) {
		t.Errorf("policy chek: exit %d stdout %q stderr %q, want exit 2 and an unknown-command error", code, stdout, stderr)
	}
	for _, tt := range tests {
		code, stdout, stderr := runCaptured(t, append([]string{"policy", "match"}, tt.args...)...)
		if code != 2 || stdout != "" || !strings.Contains(stderr, tt.want) {
			t.Errorf("policy match %q: exit %d stdout %q stderr %q, want exit 2, nothing on stdout, stderr containing %q", tt.args, code, stdout, stderr, tt.want)
		}
	}
}
