package controller_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/compass-egress/compass-egress/controller"
	"github.com/compass-egress/compass-egress/controller/controllertest"
	"github.com/compass-egress/compass-egress/policy"
	"github.com/compass-egress/compass-egress/policy/lifecycle"
)

// A phase's blocked summary is the one the provider took with the swap that ended it, so
// attempts made after the runner's last read still count; without one, the read stands in.
func TestBlockedSummaryOfEndedPhase(t *testing.T) {
	tests := []struct {
		name       string
		report     bool
		failSwitch bool // the switch to "evaluation" fails
		want       []string
		wantTrans  string // the previous_blocked of the switch to "evaluation"
	}{
		{
			name: "provider reports the ended generation", report: true,
			want:      []string{"t1:baseline:0", "t1:run:3", "t1-eval:evaluation_baseline:2", "t1-eval:evaluation:1", "t1-eval:evaluation_baseline:0"},
			wantTrans: "total=2",
		},
		{
			// The attempts after the read are lost: the limitation the swap's summary removes.
			name: "provider reports nothing", report: false,
			want:      []string{"t1:baseline:0", "t1:run:3", "t1-eval:evaluation_baseline:0", "t1-eval:evaluation:1", "t1-eval:evaluation_baseline:0"},
			wantTrans: "none",
		},
		{
			name: "failed switch reports the ended generation", report: true, failSwitch: true,
			want:      []string{"t1:baseline:0", "t1:run:3", "t1-eval:evaluation_baseline:2", "t1-eval:failed_switch:0"},
			wantTrans: "total=2",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := controllertest.New()
			p.ReportPrevious = tc.report
			p.BlockedAtSwitch = map[string]uint64{"evaluation": 2}
			if tc.failSwitch {
				p.ApplyErr = func(phase string) error {
					if phase == "evaluation" {
						return errors.New("sidecar refused")
					}
					return nil
				}
			}
			tr := task(t, policy.EvaluationFresh)
			tr.Run = []lifecycle.Command{{"blocked", "3"}}
			tr.Evaluate = []lifecycle.Command{{"blocked", "1"}}
			r := newRunner(t, p)
			_, err := r.RunTask(context.Background(), tr, nil)
			if (err != nil) != tc.failSwitch {
				t.Fatalf("run: %v", err)
			}
			rec := readRecord(t, r, "t1")
			var got []string
			for _, b := range rec.Blocked {
				if b.Error != "" {
					t.Errorf("blocked %+v", b)
				}
				got = append(got, fmt.Sprintf("%s:%s:%d", b.Environment, b.Phase, b.Summary.Total))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("blocked\n got  %v\n want %v", got, tc.want)
			}
			i := slices.IndexFunc(rec.Transitions, func(tn controller.Transition) bool { return tn.Phase == "evaluation" })
			if i < 0 {
				t.Fatalf("no switch to evaluation in %+v", rec.Transitions)
			}
			trans := "none"
			if prev := rec.Transitions[i].PreviousBlocked; prev != nil {
				trans = fmt.Sprintf("total=%d", prev.Total)
				if len(prev.Top) != 1 || prev.Top[0].Count != 2 {
					t.Errorf("previous_blocked top %+v", prev.Top)
				}
			}
			if trans != tc.wantTrans {
				t.Errorf("switch to evaluation: previous_blocked %s, want %s", trans, tc.wantTrans)
			}
		})
	}
}

// What the enforcement point dropped is recorded for every phase: for a phase a switch
// ends, from the switch's transition; for the last phase of an environment, which its
// close ends, as taken just before the close.
func TestDropsOfEveryPhase(t *testing.T) {
	for _, mode := range []policy.EvaluationMode{policy.EvaluationShared, policy.EvaluationFresh} {
		t.Run(string(mode), func(t *testing.T) {
			p := controllertest.New()
			tr := task(t, mode)
			tr.Run = []lifecycle.Command{{"dropped", "3"}}
			tr.Evaluate = []lifecycle.Command{{"dropped", "2"}}
			r := newRunner(t, p)
			if _, err := r.RunTask(context.Background(), tr, nil); err != nil {
				t.Fatalf("run: %v", err)
			}
			got := map[string]uint64{}
			for _, b := range readRecord(t, r, "t1").Blocked {
				if b.Error != "" {
					t.Errorf("blocked %+v", b)
				}
				got[b.Phase] += b.Dropped["udp"].Packets
			}
			if got["run"] != 3 || got["evaluation"] != 2 {
				t.Errorf("dropped per phase %v, want run 3 and evaluation 2", got)
			}
		})
	}
}
