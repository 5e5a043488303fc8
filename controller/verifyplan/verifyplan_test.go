package verifyplan

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compass-egress/compass-egress/images/probe/probespec"
	"github.com/compass-egress/compass-egress/policy"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the plans")

func mustParse(t *testing.T, s string) policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPlanGolden: the table of checks and expected outcomes per mode (testdata/<mode>.golden).
func TestPlanGolden(t *testing.T) {
	a := Addrs{Sidecar: netip.MustParseAddr("10.213.0.18"), Gateway: netip.MustParseAddr("10.213.0.17")}
	targets := Targets{
		Allowed: []string{"a.test:443", "a.test:80"}, Blocked: []string{"b.test:443", "b.test:80", "192.0.2.1:80"},
		AllowedTCP: []string{"git.test:22"}, BlockedTCP: []string{"b.test:22"}, Outside: netip.MustParseAddr("192.0.2.9"),
	}
	for name, pol := range map[string]string{
		"public":     `{"network_mode":"public"}`,
		"no-network": `{"network_mode":"no-network"}`,
		"allowlist":  `{"network_mode":"allowlist","allowed_hosts":["a.test","git.test:22"]}`,
		"denylist":   `{"network_mode":"denylist","denied_hosts":["b.test"]}`,
		// An IP rule covering the outside address lets the address-only check through.
		"allowlist-ip": `{"network_mode":"allowlist","allowed_hosts":["192.0.2.0/24"]}`,
	} {
		t.Run(name, func(t *testing.T) {
			checks, err := Plan(mustParse(t, pol), a, targets)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			for _, c := range checks {
				fmt.Fprintf(&b, "%s | %s | %s %s%s%s%s%s%s | want %s\n", c.Label, c.Target, c.Kind, c.Check.Target, opt("server", c.Server),
					opt("net", c.Net), opt("host", c.Host), opt("resolver", c.Resolver), opt("expect", c.Expect), c.Want)
			}
			golden(t, name+".golden", b.String())
		})
	}
}

func opt(k, v string) string {
	if v == "" {
		return ""
	}
	return " " + k + "=" + v
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("plan differs from %s (-update rewrites it)\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

func TestPlanRefusesTargetsWithoutPort(t *testing.T) {
	for _, tg := range []Targets{{Allowed: []string{"a.test"}}, {Blocked: []string{"b.test"}}, {AllowedTCP: []string{"git.test"}}, {BlockedTCP: []string{"b.test"}}} {
		if _, err := Plan(policy.NoNetwork, Addrs{}, tg); err == nil || !strings.Contains(err.Error(), "want host:port") {
			t.Errorf("Plan(%+v) = %v, want a host:port error", tg, err)
		}
	}
}

// TestObserved: how a probe result reads under each judge: a refusal the sidecar
// signed is never counted as the destination's answer.
func TestObserved(t *testing.T) {
	reach := probespec.Result{Reachable: true}
	refused := probespec.Result{Reachable: false, Refused: true}
	dnsRefused := probespec.Result{Reachable: true, Refused: true}
	for _, tc := range []struct {
		j    judge
		r    probespec.Result
		want string
	}{
		{byReachable, reach, Works}, {byReachable, probespec.Result{}, Fails},
		{byResolved, reach, Fails}, {byResolved, probespec.Result{Reachable: true, Resolved: true}, Works},
		{byRefusal, dnsRefused, Refused}, {byRefusal, reach, Works}, {byRefusal, probespec.Result{}, Fails},
		{byLetThrough, refused, Refused}, {byLetThrough, reach, NotRefused}, {byLetThrough, probespec.Result{}, NotRefused},
	} {
		if got := (Check{judge: tc.j}).Observed(tc.r); got != tc.want {
			t.Errorf("judge %d, result %+v: %s, want %s", tc.j, tc.r, got, tc.want)
		}
	}
}

func TestDropRow(t *testing.T) {
	for _, tc := range []struct {
		before, after uint64
		err           error
		want          string
	}{{3, 4, nil, "counted"}, {3, 3, nil, "not counted"}, {0, 0, fmt.Errorf("no table"), "unreadable"}} {
		_, want, got, _ := DropRow(tc.before, tc.after, tc.err)
		if want != "counted" || got != tc.want {
			t.Errorf("DropRow(%d, %d, %v) = %s (want %s), want %s", tc.before, tc.after, tc.err, got, want, tc.want)
		}
	}
}
