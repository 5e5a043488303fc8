package dockerenv

import (
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
