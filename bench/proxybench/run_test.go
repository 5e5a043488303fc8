package proxybench

import (
	"math"
	"os"
	"strings"
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

// A proxy that opened fewer idle tunnels than asked has no memory figure: the is
// per tunnel of a given number, and a figure over fewer would be checked against it.
func TestMeasureIdleLeavesOutShortCounts(t *testing.T) {
	up, err := StartUpstream()
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	self := func() []int { return []int{os.Getpid()} }
	all, short := startTestProxy(t), startTestProxy(t)
	short.tunnelLimit.Store(4)
	b := &bench{
		cfg: Config{Limits: Limits{IdleTunnels: 10, Concurrency: 2}},
		up:  up,
		rep: &Report{Errors: map[string]int64{}},
		targets: []Target{
			{Name: "all", Proxy: all.ln.Addr().String(), PIDs: self},
			{Name: "short", Proxy: short.ln.Addr().String(), PIDs: self},
		},
		idle: map[string]float64{},
	}
	b.measureIdle()
	if _, ok := b.idle["all"]; !ok || b.rep.Errors["all"] != 0 {
		t.Errorf("all tunnels opened: figure %v, %d errors; want a figure and no error", ok, b.rep.Errors["all"])
	}
	if v, ok := b.idle["short"]; ok {
		t.Errorf("4 of 10 tunnels opened: figure %.1f KiB, want none", v)
	}
	if got := b.rep.Errors["short"]; got != 6 {
		t.Errorf("4 of 10 tunnels opened: %d errors, want 6", got)
	}
	if n := strings.Join(b.rep.Notes, "\n"); !strings.Contains(n, "short opened 4 of 10 idle tunnels") {
		t.Errorf("notes %q do not say that short opened 4 of 10 tunnels", n)
	}
}

// A target whose latency rounds stopped short is named in the notes, with its count.
func TestSummariseNotesShortLatency(t *testing.T) {
	samples := func(n int) []time.Duration { return make([]time.Duration, n) }
	b := &bench{
		cfg:     Config{Rounds: 3, Limits: Limits{LatencyRequests: 100, Duration: time.Second}},
		rep:     &Report{Values: map[string]Values{}, PerRound: map[string]*RoundValues{"full": {}, "short": {}}},
		targets: []Target{{Name: "full"}, {Name: "short"}},
		samples: map[string][]time.Duration{"full": samples(300), "short": samples(250)},
	}
	b.summarise()
	notes := strings.Join(b.rep.Notes, "\n")
	if !strings.Contains(notes, "short: 250 latency samples of 300") {
		t.Errorf("notes %q do not give short's 250 samples of 300", notes)
	}
	if strings.Contains(notes, "full:") {
		t.Errorf("notes %q name full, which took every sample", notes)
	}
}
