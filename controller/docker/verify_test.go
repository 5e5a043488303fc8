package docker

import (
	"net/netip"
	"testing"

	"github.com/compass-egress/compass-egress/controller/verifyplan"
	"github.com/compass-egress/compass-egress/images/probe/probespec"
	"github.com/compass-egress/compass-egress/policy"
)

// Verify probes the task network's own gateway over TCP and UDP, and expects both to
// fail in every mode: the host must not be reachable there.
func TestPlanChecksProbeTaskGateway(t *testing.T) {
	e := &Env{plan: planFor(netip.MustParsePrefix("10.213.1.16/28"))}
	o := VerifyOptions{Outside: netip.MustParseAddr("192.0.2.7"), OutsidePort: 8080}
	for _, mode := range policy.Modes {
		t.Run(string(mode), func(t *testing.T) {
			planned, err := e.planChecks(byModeForTest[mode], o)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]probespec.Check{
				"host at task network gateway (TCP)":            {Kind: "tcp", Target: "10.213.1.17:8080"},
				"host at task network gateway (UDP, DNS query)": {Kind: "dns", Server: "10.213.1.17:53", QName: "compass-verify.test"},
			}
			for _, p := range planned {
				w, ok := want[p.Label]
				if !ok {
					continue
				}
				delete(want, p.Label)
				if p.Want != verifyplan.Fails {
					t.Errorf("%s: expected %s, want to fail in every mode", p.Label, p.Want)
				}
				if p.Kind != w.Kind || p.Check.Target != w.Target || p.Server != w.Server || p.QName != w.QName || p.Net != "" {
					t.Errorf("%s: check = %+v, want %+v", p.Label, p.Check, w)
				}
			}
			for label := range want {
				t.Errorf("no %q check planned", label)
			}
		})
	}
}

var byModeForTest = map[policy.Mode]policy.Policy{
	policy.ModePublic: policy.Public, policy.ModeNoNetwork: policy.NoNetwork,
	policy.ModeAllowlist: {Mode: policy.ModeAllowlist}, policy.ModeDenylist: {Mode: policy.ModeDenylist},
}
