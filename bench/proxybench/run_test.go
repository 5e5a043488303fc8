package proxybench

import "testing"

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
