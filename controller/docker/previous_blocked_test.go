package docker

import (
	"context"
	"testing"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/policy"
)

// The sidecar's summary of the generation a switch ended reaches the transition, from the
// switch's own PUT or, when that was refused, from the fail-closed PUT that ended it;
// what the no-network interim of a switch from public blocked counts to it too.
func TestSwitchReportsPreviousBlocked(t *testing.T) {
	tests := []struct {
		name    string
		refuse  policy.Mode // the sidecar refuses PUTs of this mode
		blocked uint64      // attempts blocked under the outgoing generation
		interim uint64      // attempts blocked while the switch rewires the agent
		wantOK  bool
	}{
		{name: "switch", blocked: 4, wantOK: true},
		{name: "nothing blocked", blocked: 0, wantOK: true},
		{name: "blocked in the interim too", blocked: 4, interim: 2, wantOK: true},
		{name: "blocked in the interim only", interim: 3, wantOK: true},
		{name: "refused switch, fail-closed PUT answers", refuse: policy.ModeAllowlist, blocked: 5},
		{name: "refused switch, fail-closed PUT ends the interim", refuse: policy.ModeAllowlist, blocked: 5, interim: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, "t5")
			e := r.open(t, "t5", policy.Public)
			r.admin.mu.Lock()
			r.admin.refuse, r.admin.blocked = tc.refuse, tc.blocked
			r.admin.blockedAfter = map[policy.Mode]uint64{policy.ModeNoNetwork: tc.interim}
			outgoing := r.admin.generation
			r.admin.mu.Unlock()

			tn, err := e.Apply(context.Background(), allowA, controller.PhaseLabel{Phase: "run"})
			if (err == nil) != tc.wantOK || tn.OK != tc.wantOK {
				t.Fatalf("switch: ok=%t err=%v, want ok=%t", tn.OK, err, tc.wantOK)
			}
			if !tc.wantOK && tn.Generation != 0 {
				t.Errorf("failed switch recorded generation %d, which never held its policy", tn.Generation)
			}
			prev := tn.PreviousBlocked
			if prev == nil {
				t.Fatalf("transition %+v has no previous_blocked", tn)
			}
			want := tc.blocked + tc.interim
			if prev.Generation != outgoing || prev.Total != want {
				t.Errorf("previous_blocked generation %d total %d, want %d and %d", prev.Generation, prev.Total, outgoing, want)
			}
			if want > 0 && (len(prev.Top) != 1 || prev.Top[0].Host != "exfil.test" || prev.Top[0].Count != want) {
				t.Errorf("previous_blocked top %+v", prev.Top)
			}
			trs, err := e.dir.lastTransitions(1)
			if err != nil || len(trs) != 1 || trs[0].PreviousBlocked == nil || trs[0].PreviousBlocked.Total != want {
				t.Errorf("transitions.jsonl: %+v %v", trs, err)
			}
		})
	}
}

// A sidecar unreachable for the switch and for the fail-closed PUT says nothing; the
// transition then has no previous_blocked rather than a made-up empty one.
func TestSwitchWithoutAnswerHasNoPreviousBlocked(t *testing.T) {
	r := newRig(t, "t6")
	e := r.open(t, "t6", policy.Public)
	r.admin.mu.Lock()
	r.admin.fail = true
	r.admin.mu.Unlock()
	tn, err := e.Apply(context.Background(), allowA, controller.PhaseLabel{Phase: "run"})
	if err == nil || tn.OK {
		t.Fatalf("switch against a refusing sidecar succeeded: %+v", tn)
	}
	if tn.PreviousBlocked != nil {
		t.Errorf("previous_blocked %+v from a sidecar that answered no PUT", tn.PreviousBlocked)
	}
}
