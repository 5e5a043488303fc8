package proxybench

import (
	"math"
	"testing"
	"time"
)

func TestParseWorkloads(t *testing.T) {
	tests := []struct {
		in      string
		want    Workloads
		wantErr bool
	}{
		{"all", AllWorkloads(), false},
		{"bulk", Workloads{Bulk: true}, false},
		{"setups, requests", Workloads{Setups: true, Requests: true}, false},
		{"latency,idle", Workloads{Latency: true, Idle: true}, false},
		{"bulk,nonsense", Workloads{}, true},
		{"", Workloads{}, true},
	}
	for _, tt := range tests {
		got, err := ParseWorkloads(tt.in)
		if (err != nil) != tt.wantErr || (!tt.wantErr && got != tt.want) {
			t.Errorf("ParseWorkloads(%q) = %+v, %v; want %+v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

// A round that measured nothing keeps its place as NaN, so that the report pairs the
// same rounds of two targets.
func TestMeasureRateKeepsRounds(t *testing.T) {
	b := &bench{rep: &Report{Errors: map[string]int64{}, PerRound: map[string]*RoundValues{"a": {}}}}
	rates := []Rate{{Ops: 10, Elapsed: time.Second}, {}, {Ops: 30, Elapsed: time.Second}}
	for i, r := range rates {
		w := rateWorkload{name: "set-ups/s", rate: MetricSetups, cost: MetricSetupCPU, scale: 1, cpuUnit: 1e6,
			run: func(Target) (Rate, error) { return r, nil }}
		b.measureRate(i+1, Target{Name: "a"}, w)
	}
	got := b.rep.PerRound["a"]
	if s := got[MetricSetups]; len(s) != 3 || s[0] != 10 || !math.IsNaN(s[1]) || s[2] != 30 {
		t.Errorf("set-ups per round = %v, want [10 NaN 30]", s)
	}
	// No process, so no CPU: one NaN per round all the same.
	if s := got[MetricSetupCPU]; len(s) != 3 || !math.IsNaN(s[0]) || !math.IsNaN(s[2]) {
		t.Errorf("CPU per round = %v, want three NaNs", s)
	}
}
