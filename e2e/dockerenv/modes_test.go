package dockerenv

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy"
)

// Every mode as the baseline of a freshly opened environment.
func TestOpenInEveryMode(t *testing.T) {
	h.Need(t)
	t.Parallel()
	p := h.Provider(t)
	for _, mode := range policy.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			e := h.Open(t, p, "mode", byMode[mode])
			assertState(t, e, mode)
		})
	}
}

// Every ordered pair of modes, in one walk through the twelve transitions.
func TestEveryTransition(t *testing.T) {
	h.Need(t)
	t.Parallel()
	P, N, A, D := policy.ModePublic, policy.ModeNoNetwork, policy.ModeAllowlist, policy.ModeDenylist
	walk := []policy.Mode{P, N, P, A, P, D, N, A, N, D, A, D, P}
	seen := map[[2]policy.Mode]bool{}
	p := h.Provider(t)
	e := h.Open(t, p, "walk", byMode[walk[0]])
	for i := 1; i < len(walk); i++ {
		from, to := walk[i-1], walk[i]
		seen[[2]policy.Mode{from, to}] = true
		ok := t.Run(string(from)+"->"+string(to), func(t *testing.T) {
			tr, err := e.Apply(timeout(t, 3*time.Minute), byMode[to], controller.PhaseLabel{Phase: "walk"})
			if err != nil {
				t.Fatalf("switch: %v", err)
			}
			if !tr.OK || tr.FromMode != from || tr.ToMode != to || tr.Generation == 0 || tr.Digest != byMode[to].Digest() {
				t.Errorf("transition record = %+v", tr)
			}
			assertState(t, e, to)
		})
		if !ok {
			break
		}
	}
	if len(seen) != 12 {
		t.Fatalf("walk covered %d of 12 transitions", len(seen))
	}
}

// A 100k-entry allowlist goes through the controller and the real sidecar as a small
// one does: the sidecar's acknowledgement, which repeats the policy (about 2 MiB of
// it), is read whole, and the new set is in force: allowed.test, among 99 999 other
// names, is reachable, blocked.test is not.
func TestLargeAllowlistSwitch(t *testing.T) {
	h.Need(t)
	t.Parallel()
	hosts := make([]string, 0, 100_000)
	for i := range 99_999 {
		hosts = append(hosts, fmt.Sprintf("h%d.large.test", i))
	}
	hosts = append(hosts, "allowed.test")
	doc, err := json.Marshal(map[string]any{"network_mode": "allowlist", "allowed_hosts": hosts})
	if err != nil {
		t.Fatal(err)
	}
	large := mustParse(string(doc))
	p := h.Provider(t)
	e := h.Open(t, p, "large", policy.NoNetwork)
	tr, err := e.Apply(timeout(t, 3*time.Minute), large, controller.PhaseLabel{Phase: "large"})
	if err != nil {
		t.Fatalf("switch to a 100k-entry allowlist: %v", err)
	}
	if !tr.OK || tr.ToMode != policy.ModeAllowlist || tr.Digest != large.Digest() {
		t.Errorf("transition record = %+v", tr)
	}
	assertState(t, e, policy.ModeAllowlist)
}
