package proxy

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// TestModesAndRuleKinds checks every mode and rule kind over HTTP and CONNECT.
func TestModesAndRuleKinds(t *testing.T) {
	h := newHarness(t)
	ap, bp := h.a.httpPort, h.b.httpPort
	type probe struct {
		host   string
		port   uint16
		reason string // "" means allowed; tunnelOnly means allowed, probed by CONNECT only
	}
	cases := []struct {
		name   string
		policy string
		probes []probe
	}{
		{"public", `"public"`, []probe{{"a.test", ap, ""}, {"b.test", bp, ""}}},
		{"no-network", `"no-network"`, []probe{{"a.test", ap, "no-network"}, {"127.0.0.2", ap, "no-network"}}},
		{"allowlist host", `{"network_mode":"allowlist","allowed_hosts":["a.test"]}`, []probe{
			{"a.test", ap, ""}, {"A.TEST.", ap, ""}, {"b.test", bp, "not-allowlisted"},
			{"127.0.0.2", ap, "not-allowlisted"}}},
		{"allowlist host:port", fmt.Sprintf(`{"network_mode":"allowlist","allowed_hosts":["a.test:%d"]}`, ap), []probe{
			{"a.test", ap, ""}, {"a.test", bp, "not-allowlisted"}}},
		{"allowlist object port", fmt.Sprintf(`{"network_mode":"allowlist","allowed_hosts":[{"host":"b.test","port":%d}]}`, bp), []probe{
			{"b.test", bp, ""}, {"b.test", ap, "not-allowlisted"}}},
		{"allowlist wildcard", `{"network_mode":"allowlist","allowed_hosts":["*.svc.test"]}`, []probe{
			{"x.svc.test", h.c.httpPort, ""}, {"svc.test", h.c.httpPort, "not-allowlisted"}, {"a.test", ap, "not-allowlisted"}}},
		{"allowlist ip", `{"network_mode":"allowlist","allowed_hosts":["127.0.0.3"]}`, []probe{
			{"b.test", bp, ""}, {"127.0.0.3", bp, ""}, {"a.test", ap, "not-allowlisted"}, {"127.0.0.2", ap, "not-allowlisted"}}},
		{"allowlist cidr", `{"network_mode":"allowlist","allowed_hosts":["127.0.0.2/31"]}`, []probe{
			{"a.test", ap, ""}, {"b.test", bp, ""}, {"x.svc.test", h.c.httpPort, "not-allowlisted"}}},
		{"allowlist ip:port", fmt.Sprintf(`{"network_mode":"allowlist","allowed_hosts":["127.0.0.2:%d"]}`, ap), []probe{
			{"a.test", ap, ""}, {"127.0.0.2", h.a.echoPort, "not-allowlisted"}}},
		{"allowlist wildcard:port", fmt.Sprintf(`{"network_mode":"allowlist","allowed_hosts":["*.svc.test:%d"]}`, h.c.httpPort), []probe{
			{"x.svc.test", h.c.httpPort, ""}, {"x.svc.test", h.c.echoPort, "not-allowlisted"}}},
		{"allowlist cidr:port", fmt.Sprintf(`{"network_mode":"allowlist","allowed_hosts":["127.0.0.2/31:%d"]}`, ap), []probe{
			{"a.test", ap, ""}, {"127.0.0.2", h.a.echoPort, "not-allowlisted"}, {"b.test", bp, "not-allowlisted"}}},
		{"allowlist empty", `{"network_mode":"allowlist","allowed_hosts":[]}`, []probe{{"a.test", ap, "not-allowlisted"}}},
		{"denylist host", `{"network_mode":"denylist","denied_hosts":["b.test"]}`, []probe{
			{"a.test", ap, ""}, {"b.test", bp, "denylisted"}, {"B.Test.", bp, "denylisted"}}},
		{"denylist host:port", fmt.Sprintf(`{"network_mode":"denylist","denied_hosts":["b.test:%d"]}`, bp), []probe{
			{"b.test", bp, "denylisted"}, {"b.test", h.b.echoPort, tunnelOnly}}},
		{"denylist wildcard", `{"network_mode":"denylist","denied_hosts":["*.svc.test"]}`, []probe{
			{"x.svc.test", h.c.httpPort, "denylisted"}, {"svc.test", h.c.httpPort, ""}}},
		{"denylist ip", `{"network_mode":"denylist","denied_hosts":["127.0.0.3"]}`, []probe{
			{"b.test", bp, "denylisted"}, {"127.0.0.3", bp, "denylisted"}, {"a.test", ap, ""}}},
		{"denylist cidr", `{"network_mode":"denylist","denied_hosts":["127.0.0.0/30"]}`, []probe{
			{"a.test", ap, "denylisted"}, {"x.svc.test", h.c.httpPort, ""}}},
		{"denylist empty", `{"network_mode":"denylist","denied_hosts":[]}`, []probe{{"b.test", bp, ""}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h.apply(tc.policy)
			for _, p := range tc.probes {
				target := fmt.Sprintf("%s:%d", p.host, p.port)
				if p.reason != tunnelOnly {
					status, header, body := h.get("http://" + target + "/")
					checkOutcome(t, "HTTP "+target, status, header, p.reason)
					if p.reason == "" && !strings.Contains(body, "host="+target) {
						t.Errorf("HTTP %s: upstream saw %q", target, body)
					}
					if p.reason != "" && !strings.Contains(body, p.reason) {
						t.Errorf("HTTP %s: refusal body %q does not say why", target, body)
					}
				}
				status, header := h.connectStatus(target)
				checkOutcome(t, "CONNECT "+target, status, header, strings.TrimPrefix(p.reason, tunnelOnly))
			}
		})
	}
}

// tunnelOnly marks an allowed probe of an echo port, which speaks no HTTP.
const tunnelOnly = "(tunnel only)"

func checkOutcome(t *testing.T, what string, status int, header, reason string) {
	t.Helper()
	if reason == "" {
		if status != http.StatusOK {
			t.Errorf("%s: status %d (%s), want allowed", what, status, header)
		}
		return
	}
	if status != http.StatusForbidden || header != "denied; reason="+reason {
		t.Errorf("%s: status %d header %q, want 403 with reason %s", what, status, header, reason)
	}
}

// TestIPv6RuleKinds: IPv6 address, CIDR and [address]:port rules match the address a
// name resolves to and an IPv6 literal alike (an upstream on ::1, which the rule lifts
// the loopback guard for, as it would a public IPv6 address).
func TestIPv6RuleKinds(t *testing.T) {
	h := newHarness(t)
	v6 := startUpstream(t, "::1")
	h.dns.set("v6.test", netip.MustParseAddr("::1"))
	hp, ep := v6.httpPort, v6.echoPort
	cases := []struct {
		policy string
		target string
		reason string // "" = allowed
	}{
		{`{"network_mode":"allowlist","allowed_hosts":["::1"]}`, fmt.Sprintf("[::1]:%d", hp), ""},
		{`{"network_mode":"allowlist","allowed_hosts":["::1"]}`, fmt.Sprintf("v6.test:%d", hp), ""},
		{`{"network_mode":"allowlist","allowed_hosts":["::1/128"]}`, fmt.Sprintf("v6.test:%d", hp), ""},
		{fmt.Sprintf(`{"network_mode":"allowlist","allowed_hosts":["[::1]:%d"]}`, hp), fmt.Sprintf("v6.test:%d", hp), ""},
		{fmt.Sprintf(`{"network_mode":"allowlist","allowed_hosts":["[::1]:%d"]}`, hp), fmt.Sprintf("[::1]:%d", ep), "not-allowlisted"},
		{`{"network_mode":"allowlist","allowed_hosts":["2001:db8::/32"]}`, fmt.Sprintf("v6.test:%d", hp), "not-allowlisted"},
		{`{"network_mode":"denylist","denied_hosts":["::1"]}`, fmt.Sprintf("v6.test:%d", hp), "denylisted"},
	}
	for _, tc := range cases {
		t.Run(tc.policy+" "+tc.target, func(t *testing.T) {
			h.apply(tc.policy)
			status, header := h.connectStatus(tc.target)
			checkOutcome(t, "CONNECT "+tc.target, status, header, tc.reason)
		})
	}
}
